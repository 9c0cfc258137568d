"""`pinmq check HISTORY [--master URL] [--report DIR] [--cache DIR]`: the checker's verdict.

HISTORY is a directory, a glob or a URI Spark's Hadoop layer reads (pipeline/segments.py).
Exit codes: 0 clean, 1 violations found, 2 the input (or Spark) cannot be used; user errors
are one line `pinmq: error: ...`, never a stack trace. `summary.json` goes to the report
directory when given, else into a local HISTORY directory (readers only look at `*.jsonl`
files there); any other history needs `--report`. `--cache` keeps the parsed events for the
next check of the same segments (pipeline/cache.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pipeline.segments import GLOB, HistoryError, local_path
from pipeline.spark import DEFAULT_MASTER, SparkUnavailable, session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.job import Result

LABELS = {
    "lost": "lost messages",
    "duplicates": "duplicate deliveries",
    "order": "order violations",
    "exclusivity": "exclusivity violations",
    "routing": "routing inconsistencies",
}


def verdict(result: Result) -> list[str]:
    """The short verdict printed at the end of a check."""
    h = result.history
    lines = [
        f"read {h.lines:,} lines from {h.files} segment(s) in {result.seconds:.1f} s: "
        + ", ".join(f"{n:,} {k}" for k, n in sorted(h.kinds.items()))
    ]
    lines += [f"warning: {w}" for w in h.warnings()]
    lines += [f"note: {n}" for n in result.notes]
    for kind, label in LABELS.items():
        count = result.counts.get(kind, 0)
        mark = "ok  " if count == 0 else "FAIL"
        lines.append(f"  {mark} {label}: {count:,}")
        for ex in result.examples.get(kind, [])[:3]:
            lines.append(f"       e.g. {_brief(ex)}")
    total = sum(result.counts.values())
    lines.append("verdict: CLEAN" if total == 0 else f"verdict: VIOLATIONS ({total:,})")
    return lines


def _brief(example: dict[str, Any]) -> str:
    keys = ("key", "queue", "group", "group_seq", "consumer", "node", "epoch", "targets")
    return " ".join(f"{k}={example[k]}" for k in keys if example.get(k) is not None)


def run_check(
    history: str | Path,
    *,
    master: str = DEFAULT_MASTER,
    report: str | Path | None = None,
    cache: str | Path | None = None,
    spark: SparkSession | None = None,
    out: TextIO | None = None,
) -> int:
    """The `check` verb; `spark` reuses a session (tests), else one is started on `master`."""
    out = out or sys.stdout
    target = Path(report) if report is not None else local_path(history)
    try:  # the cheap user errors, before Spark starts
        if target is None or (report is None and GLOB.search(str(history))):
            raise HistoryError(f"--report DIR is needed: summary.json cannot go to {history}")
        if report is not None and target.exists() and not target.is_dir():
            raise HistoryError(f"report directory {report} is a file")
        from pipeline import job

        result = job.run(spark or session(master), history, cache=cache)
    except (HistoryError, SparkUnavailable) as err:
        print(f"pinmq: error: {err}", file=sys.stderr)
        return 2
    summary = result.summary()
    for line in verdict(result):
        print(line, file=out)
    try:
        if report is not None:
            from pipeline.report import write

            path = write(summary, target)
            print(f"report: {path}", file=out)
        else:
            (target / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        print(f"summary: {target / 'summary.json'}", file=out)
    except OSError as err:
        print(f"pinmq: error: cannot write to {target}: {err.strerror or err}", file=sys.stderr)
        return 2
    return 0 if result.clean else 1
