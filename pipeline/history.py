"""Reading an audit history (the JSONL segments of broker/audit.py) into one Spark DataFrame.

Every `*.jsonl` file under the directory is read as text and parsed with an explicit schema
(`SCHEMA`), in one pass that also flags what the checker must report rather than trust:
- malformed lines (not JSON, not an object, or without `ts_ns`, `node` or `kind`) are counted
  and left out, except a torn last line of a file (no final newline: the writer died in the
  middle of it), which is tolerated and counted separately;
- unknown keys are listed and ignored (the schema only ever grows; an old checker reading a
  newer history says what it skipped), and so are unknown `kind` values. Keys are looked for
  in the first `SAMPLE_LINES` lines and the tail of every segment, not in every line.

Columns added to the events: `key` (the end-to-end message identity: `mid`, else
`<node>:<msg_id>`; it replaces `mid`), `boot` (from the segment file name: which run of the
writer wrote the event, so a node restarted after a crash is told apart from its previous
run), `source`
(`node` or `client`) and `internal` (a queue whose name starts with `$`, such as the cluster's
store-and-forward queues, which no consumer sees).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.audit import CLIENT_KINDS, KINDS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

REQUIRED = ("ts_ns", "node", "kind")
FIELDS: list[tuple[str, str]] = [
    ("ts_ns", "long"),
    ("node", "string"),
    ("epoch", "long"),
    ("kind", "string"),
    ("msg_id", "long"),
    ("mid", "string"),
    ("address", "string"),
    ("queue", "string"),
    ("group", "string"),
    ("group_seq", "long"),
    ("producer", "string"),
    ("consumer", "string"),
    ("delivery_count", "long"),
    ("n", "long"),
    ("target", "string"),
    ("new_proposal", "boolean"),
    ("decision_ns", "long"),
    ("consumer_name", "string"),
]
KNOWN_KEYS = frozenset(name for name, _ in FIELDS)
EXAMPLES = 5
SAMPLE_LINES = 5000  # lines per segment searched for unknown keys (plus its tail)


class HistoryError(Exception):
    """The history cannot be checked (a user error): the message says why, in one line."""


def schema() -> Any:
    from pyspark.sql import types as T

    types = {"long": T.LongType(), "string": T.StringType(), "boolean": T.BooleanType()}
    return T.StructType([T.StructField(name, types[kind]) for name, kind in FIELDS])


@dataclass
class History:
    """The parsed events (cached) and what reading them turned up."""

    directory: Path
    events: DataFrame
    files: int
    table: Any = None  # the cached parse (events plus bad lines); unpersist when done
    kinds: dict[str, int] = field(default_factory=dict)  # events per known kind
    lines: int = 0
    malformed: int = 0
    torn: int = 0
    malformed_examples: list[str] = field(default_factory=list)
    unknown_keys: dict[str, int] = field(default_factory=dict)
    unknown_kinds: dict[str, int] = field(default_factory=dict)

    def warnings(self) -> list[str]:
        out = []
        if self.malformed:
            out.append(
                f"{self.malformed} malformed line(s) skipped, e.g. "
                + "; ".join(self.malformed_examples[:2])
            )
        if self.torn:
            out.append(f"{self.torn} torn last line(s) skipped (a writer died mid-line)")
        if self.unknown_keys:
            keys = ", ".join(f"{k} ({n})" for k, n in sorted(self.unknown_keys.items()))
            out.append(f"unknown field(s) ignored: {keys}")
        if self.unknown_kinds:
            kinds = ", ".join(f"{k} ({n})" for k, n in sorted(self.unknown_kinds.items()))
            out.append(f"unknown event kind(s) ignored: {kinds}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory),
            "files": self.files,
            "lines": self.lines,
            "malformed_lines": self.malformed,
            "torn_last_lines": self.torn,
            "malformed_examples": self.malformed_examples,
            "unknown_fields": self.unknown_keys,
            "unknown_kinds": self.unknown_kinds,
        }


def segment_files(directory: str | Path) -> list[Path]:
    """The segment files to read; HistoryError when there is nothing to check."""
    path = Path(directory)
    if not path.exists():
        raise HistoryError(f"history directory {path} does not exist")
    if not path.is_dir():
        raise HistoryError(f"{path} is not a directory")
    files = sorted(p for p in path.rglob("*.jsonl") if p.is_file())
    if not files:
        raise HistoryError(f"no audit segments (*.jsonl) under {path}")
    if all(p.stat().st_size == 0 for p in files):
        raise HistoryError(f"the {len(files)} audit segment(s) under {path} are empty")
    return files


def torn_tails(files: list[Path]) -> dict[str, str]:
    """file name -> its last line, for files whose last line is torn (no newline, not JSON)."""
    torn = {}
    for path in files:
        size = path.stat().st_size
        if size == 0:
            continue
        with path.open("rb") as f:
            f.seek(max(0, size - (1 << 16)))
            tail = f.read()
        if tail.endswith(b"\n"):
            continue
        last = tail.rpartition(b"\n")[2]
        try:
            event = json.loads(last)
            if isinstance(event, dict) and all(event.get(k) is not None for k in REQUIRED):
                continue  # complete, only the newline is missing
        except ValueError:
            pass
        torn[path.name] = last.decode("utf-8", "replace")
    return torn


def unknown_keys(files: list[Path], lines_per_file: int = SAMPLE_LINES) -> dict[str, int]:
    """Unknown keys (name -> lines seen with it) in the first lines and the tail of each file.

    A sample, not every line: a writer writes every line the same way, and parsing each line
    twice would double the reading cost of the checker.
    """
    seen: dict[str, int] = {}

    def scan(raw_lines: list[bytes]) -> None:
        for raw in raw_lines:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if isinstance(event, dict):
                for key in event.keys() - KNOWN_KEYS:
                    seen[key] = seen.get(key, 0) + 1

    for path in files:
        with path.open("rb") as f:
            head = list(itertools.islice(f, lines_per_file))
            size = path.stat().st_size
            tail: list[bytes] = []
            if f.tell() < size:
                f.seek(max(f.tell(), size - (1 << 16)))
                tail = f.read().split(b"\n")[1:]
        scan(head)
        scan(tail)
    return seen


def load(spark: SparkSession, directory: str | Path) -> History:
    """Read every segment under `directory`; raises HistoryError when nothing is usable.

    The parsed events are kept by Spark (memory, spilling to disk) for the checks that follow;
    call `History.events.unpersist()` when done.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    files = segment_files(directory)
    root = Path(directory).resolve()
    spark.conf.set("spark.sql.inMemoryColumnarStorage.compressed", "false")  # 2x faster build
    raw = (
        spark.read.option("recursiveFileLookup", "true")
        .option("pathGlobFilter", "*.jsonl")
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt")
        .schema(schema().add(T.StructField("_corrupt", T.StringType())))
        .json(str(root))
    )
    bad = F.col("_corrupt").isNotNull()
    for name in REQUIRED:
        bad = bad | F.col(name).isNull()
    boot = F.regexp_extract(F.col("_metadata.file_name"), r"-(\d+)-\d+\.jsonl$", 1)
    key = F.coalesce(F.col("mid"), F.concat_ws(":", "node", F.col("msg_id").cast("string")))
    table = raw.select(
        *[name for name, _ in FIELDS if name != "mid"],
        key.alias("key"),
        F.when(boot != "", boot.cast("long")).otherwise(F.lit(0)).alias("boot"),
        bad.alias("bad"),
        F.when(bad, F.coalesce("_corrupt", F.to_json(F.struct(*[n for n, _ in FIELDS])))).alias(
            "raw"
        ),
        F.when(bad, F.col("_metadata.file_name")).alias("file"),
    ).persist(StorageLevel.MEMORY_AND_DISK)

    counts = table.groupBy("bad", "kind").count().collect()
    lines = sum(int(r["count"]) for r in counts)
    bad_count = sum(int(r["count"]) for r in counts if r["bad"])
    history = History(root, table, files=len(files), lines=lines)
    history.unknown_kinds = {
        r["kind"]: int(r["count"]) for r in counts if not r["bad"] and r["kind"] not in KINDS
    }
    history.kinds = {
        r["kind"]: int(r["count"]) for r in counts if not r["bad"] and r["kind"] in KINDS
    }
    history.unknown_keys = unknown_keys(files)
    if bad_count:
        tails = torn_tails(files)
        torn_cond = F.lit(False)
        for name, line in tails.items():
            torn_cond = torn_cond | ((F.col("file") == name) & (F.col("raw") == line))
        history.torn = table.filter(F.col("bad") & torn_cond).count() if tails else 0
        history.malformed = bad_count - history.torn
        examples = (
            table.filter(F.col("bad") & ~torn_cond).select("file", "raw").limit(EXAMPLES).collect()
        )
        history.malformed_examples = [f"{r['file']}: {_clip(r['raw'])}" for r in examples]
    good = lines - bad_count - sum(history.unknown_kinds.values())
    if good <= 0:
        table.unpersist()
        raise HistoryError(
            f"no valid audit events in {len(files)} segment(s) under {root} "
            f"({history.malformed} malformed line(s), {history.torn} torn)"
        )
    history.events = table.filter(~F.col("bad") & F.col("kind").isin(*KINDS)).select(
        *[name for name, _ in FIELDS if name != "mid"],
        "key",
        "boot",
        F.when(F.col("kind").isin(*CLIENT_KINDS), "client").otherwise("node").alias("source"),
        F.coalesce(F.col("queue").startswith("$"), F.lit(False)).alias("internal"),
    )
    history.table = table
    return history


def _clip(text: str | None, limit: int = 80) -> str:
    text = text or ""
    return text if len(text) <= limit else text[: limit - 3] + "..."
