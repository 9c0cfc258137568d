"""Figures read from what the benchmarks print, and the paired table over them (bench/compare.py).

One extractor per known benchmark reads the format its script prints at 200d2dd and later: the
base trees bench/compare.py runs are as old as that, so the scripts' output cannot change to
suit it. Each figure knows whether higher or lower is better.
"""

from __future__ import annotations

import math
import re
import shlex
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class FigureError(Exception):
    """A benchmark this module cannot read, or output it cannot read; the script is named."""


@dataclass(frozen=True, slots=True)
class Figure:
    """One figure of one run, e.g. `100 groups backlog: consume msg/s`."""

    name: str
    value: float
    higher_is_better: bool


def _num(text: str) -> float:
    """A figure as the benchmarks print it: `17,003`, `5.71`, `0.24s`."""
    return float(text.replace(",", "").removesuffix("s"))


def _under(output: str, header: str) -> list[str]:
    """The lines after the last one containing `header` (a summary's table head)."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if header in line]
    if not starts:
        raise ValueError(f"no line with {header!r}")
    return lines[starts[-1] + 1 :]


def _rows(output: str, header: str, width: int) -> list[list[str]]:
    """The rows of width `width` right under the last line containing `header`."""
    rows = []
    for line in _under(output, header):
        fields = line.split()
        if len(fields) != width:
            break
        if fields[-1] == "FAIL":
            raise ValueError(f"a row failed its checks: {line.strip()}")
        rows.append(fields)
    if not rows:
        raise ValueError(f"no rows under {header!r}")
    return rows


def _groups(n: str, mode: str = "") -> str:
    return f"{n} group{'' if n == '1' else 's'}{' ' + mode if mode else ''}"


def stomp_figures(output: str) -> list[Figure]:
    """pinmq's rows of the summary: consume msg/s and broker CPU us/msg, medians over rounds."""
    # broker groups mode round send consume clients broker groups/consumer other checks
    rows = [r for r in _rows(output, "consume msg/s", 11) if r[0] == "pinmq"]
    if not rows:
        raise ValueError("no pinmq rows in the summary")
    by: dict[str, list[list[str]]] = {}
    for r in rows:
        by.setdefault(_groups(r[1], r[2]), []).append(r)
    out = []
    for scenario, runs in by.items():
        consume = statistics.median(_num(r[5]) for r in runs)
        cpu = statistics.median(_num(r[7]) for r in runs)
        out += [
            Figure(f"{scenario}: consume msg/s", consume, True),
            Figure(f"{scenario}: broker CPU µs/msg", cpu, False),
        ]
    return out


def core_dispatch_figures(output: str) -> list[Figure]:
    """Per group count: mean and p50 µs per message, msg/s."""
    # groups setup mean p50 p99 msg/s ratio p50-ratio
    out = []
    for r in _rows(output, "mean us", 8):
        label = _groups(r[0])
        out += [
            Figure(f"{label}: mean µs", _num(r[2]), False),
            Figure(f"{label}: p50 µs", _num(r[3]), False),
            Figure(f"{label}: msg/s", _num(r[5]), True),
        ]
    return out


def end_to_end_figures(output: str) -> list[Figure]:
    """Per scenario of the summary: e2e and send msg/s, p50/p99 latency, node CPU."""
    # groups mode e2e send p50 p99 client-CPU node-CPU checks
    out = []
    for r in _rows(output, "e2e msg/s", 9):
        label = _groups(r[0], r[1])
        out += [
            Figure(f"{label}: e2e msg/s", _num(r[2]), True),
            Figure(f"{label}: send msg/s", _num(r[3]), True),
            Figure(f"{label}: p50 ms", _num(r[4]), False),
            Figure(f"{label}: p99 ms", _num(r[5]), False),
            Figure(f"{label}: node CPU s", _num(r[7]), False),
        ]
    return out


_CLUSTER_ROW = re.compile(
    r"(?P<run>\S.*?)\s+(?P<e2e>[\d,]+)\s+(?P<send>[\d,]+)\s+(?P<p50>[\d.]+)\s+(?P<p99>[\d.]+)"
    r"\s+(?P<cpu>[\d,]+) us\s+\d+%\s+(?P<checks>PASS|FAIL)"
)
_CLUSTER_RATIO = re.compile(
    r"ratio (?P<run>.+) / standalone: (?P<e2e>[\d.]+) end-to-end .*"
    r"node CPU per message (?P<cpu>[\d.]+)x"
)


def cluster_throughput_figures(output: str) -> list[Figure]:
    """Per run of the summary (standalone, each cluster variant): e2e and send msg/s, p50/p99
    latency, node CPU per message; and each variant's same-run ratios to the standalone node,
    the figures a shared machine's drift moves least. A run's label may hold spaces."""
    out = []
    for line in _under(output, "node CPU/msg"):
        if row := _CLUSTER_ROW.fullmatch(line.strip()):
            if row["checks"] == "FAIL":
                raise ValueError(f"a row failed its checks: {line.strip()}")
            run = row["run"]
            out += [
                Figure(f"{run}: e2e msg/s", _num(row["e2e"]), True),
                Figure(f"{run}: send msg/s", _num(row["send"]), True),
                Figure(f"{run}: p50 ms", _num(row["p50"]), False),
                Figure(f"{run}: p99 ms", _num(row["p99"]), False),
                Figure(f"{run}: node CPU µs/msg", _num(row["cpu"]), False),
            ]
        elif ratio := _CLUSTER_RATIO.fullmatch(line.strip()):
            run = ratio["run"]
            out += [
                Figure(f"{run} / standalone: e2e", _num(ratio["e2e"]), True),
                Figure(f"{run} / standalone: node CPU per message", _num(ratio["cpu"]), False),
            ]
        else:
            break
    if not out:
        raise ValueError("no rows under 'node CPU/msg'")
    return out


EXTRACTORS: dict[str, Callable[[str], list[Figure]]] = {
    "stomp_vs_activemq.py": stomp_figures,
    "core_dispatch.py": core_dispatch_figures,
    "end_to_end.py": end_to_end_figures,
    "cluster_throughput.py": cluster_throughput_figures,
}


def script_of(bench: str) -> str:
    """The benchmark's script name, checked against the extractors."""
    argv = shlex.split(bench)
    name = Path(argv[0]).name if argv else ""
    if name not in EXTRACTORS:
        known = ", ".join(f"bench/{k}" for k in EXTRACTORS)
        raise FigureError(f"unknown benchmark {bench!r}: figures can be read from {known}")
    return name


def figures(bench: str, output: str) -> list[Figure]:
    """The figures of one run, or a FigureError naming the script."""
    name = script_of(bench)
    try:
        return EXTRACTORS[name](output)
    except ValueError as err:
        raise FigureError(f"cannot read the figures of {name} ({bench}): {err}") from err


# ---- medians, ratios, spread ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    """One figure over all pairs: medians, the ratio of the medians, per-pair ratio range."""

    higher_is_better: bool
    base: float
    new: float
    ratio: float
    low: float
    high: float
    pairs: int

    @property
    def verdict(self) -> str:
        if math.isnan(self.ratio) or math.isnan(self.low):
            return "n/a (base is 0)"
        if self.pairs < 2:
            return "one pair: no spread"
        if self.low <= 1.0 <= self.high:
            return "within noise"
        up = self.low > 1.0
        return "better" if up == self.higher_is_better else "worse"


def _div(a: float, b: float) -> float:
    return a / b if b else math.nan


def summarize(higher_is_better: bool, base: list[float], new: list[float]) -> Row:
    """Pair i is (base[i], new[i])."""
    ratios = [r for r in map(_div, new, base) if not math.isnan(r)]
    mb, mn = statistics.median(base), statistics.median(new)
    low, high = min(ratios, default=math.nan), max(ratios, default=math.nan)
    return Row(higher_is_better, mb, mn, _div(mn, mb), low, high, len(base))


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "n/a"
    digits = 0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2
    return f"{v:,.{digits}f}"


def _ratio(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{v:.2f}"


def table(bench: str, base_runs: list[list[Figure]], new_runs: list[list[Figure]]) -> str:
    """A Markdown table of one benchmark's figures; the figures some run lacked are named."""
    base = [{f.name: f.value for f in run} for run in base_runs]
    new = [{f.name: f.value for f in run} for run in new_runs]
    common = [f for f in base_runs[0] if all(f.name in run for run in base + new)]
    lines = [
        f"### `{bench}`",
        "",
        "| figure | base median | new median | new/base | spread (min-max) | better? |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for f in common:
        r = summarize(f.higher_is_better, [b[f.name] for b in base], [n[f.name] for n in new])
        lines.append(
            f"| {f.name} {'↑' if f.higher_is_better else '↓'} | {_fmt(r.base)} | {_fmt(r.new)} "
            f"| {_ratio(r.ratio)} | {_ratio(r.low)}-{_ratio(r.high)} | {r.verdict} |"
        )
    missing = sorted({name for run in base + new for name in run} - {f.name for f in common})
    if missing:
        lines += ["", f"Not in every run, left out: {', '.join(missing)}."]
    return "\n".join(lines)
