"""Reading an audit history (the JSONL segments of broker/audit.py) into one Spark DataFrame.

Every `*.jsonl` file under the history (a directory, glob or URI, listed through Hadoop:
pipeline/segments.py) is parsed once by Spark's JSON reader with an explicit
schema (`schema()`: the audit log's own, `broker/audit_schema.py`, one column per field) and
kept (memory, spilling to disk) for the checks; one aggregation over that cache then gives every
count the checker reports about its input:
- malformed lines (not JSON, not an object, or without `ts_ns`, `node` or `kind`) are counted
  and left out, except a torn last line of a file (no final newline: the writer died in the
  middle of it), which is tolerated and counted separately;
- unknown keys are listed (with a file they occur in) and ignored: the schema only ever grows,
  and an old checker reading a newer history says what it skipped. So are unknown `kind` values.

Unknown keys are found for every line without parsing each line twice (which would cost a
third of the checker's time): each parsed event gets its `width`, the bytes its known fields
take in compact JSON. A line is never shorter than that, and any extra key makes it longer, so
a file whose size is the sum of its lines' widths (plus newlines) has no unknown key. Only the
files that do not add up (extra keys, but also spaces, escaped characters, malformed lines) are
read again and their keys listed line by line (`json_object_keys`). The one way a line can be
shorter than its width, a text field holding a bare number or object where a string belongs,
is never written by pinmq's writers.

Columns added to the events: `key` (the end-to-end message identity: `mid`, else
`<node>:<msg_id>`; it replaces `mid`), `boot` (from the segment file name: which run of the
writer wrote the event, so a node restarted after a crash is told apart from its previous run),
`source` (`node` or `client`) and `internal` (a queue whose name starts with `$`, such as the
cluster's store-and-forward queues, which no consumer sees).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.audit_schema import CLIENT_KINDS, FIELDS, KINDS, SEGMENT_RE
from pipeline.segments import HistoryError, Segment, list_segments, tail, uri_of

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

REQUIRED = tuple(f.name for f in FIELDS if f.required)
COLUMNS = tuple(f.name for f in FIELDS)
KNOWN_KEYS = frozenset(COLUMNS)
EXAMPLES = 5
FILES_PER_KEY = 3  # files named per unknown key


def schema() -> Any:
    """The events' Spark schema: one column per field of the audit schema, in its order."""
    from pyspark.sql import types as T

    types = {int: T.LongType(), str: T.StringType(), bool: T.BooleanType()}
    return T.StructType([T.StructField(f.name, types[f.type]) for f in FIELDS])


@dataclass
class History:
    """The parsed events (cached) and what reading them turned up."""

    directory: str  # the URI read
    events: DataFrame
    files: int
    table: Any = None  # the cached parse (events plus bad lines); unpersist when done
    runs: list[tuple[str, int, str, int]] = field(default_factory=list)  # see `run_ends`
    kinds: dict[str, int] = field(default_factory=dict)  # events per known kind
    visible: dict[str, int] = field(default_factory=dict)  # the same, not on `$` queues
    lines: int = 0
    malformed: int = 0
    torn: int = 0
    malformed_examples: list[str] = field(default_factory=list)
    unknown_keys: dict[str, int] = field(default_factory=dict)  # key -> lines with it
    unknown_key_files: dict[str, list[str]] = field(default_factory=dict)  # key -> files
    unknown_kinds: dict[str, int] = field(default_factory=dict)
    rechecked: int = 0  # files read a second time, for their keys, as they did not add up

    def run_ends(self) -> DataFrame:
        """(node, boot, source, run_end): when each writer run's last event happened."""
        return self.events.sparkSession.createDataFrame(
            self.runs, "node string, boot long, source string, run_end long"
        )

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
            keys = ", ".join(
                f"{k} ({n}, in {', '.join(self.unknown_key_files[k])})"
                for k, n in sorted(self.unknown_keys.items())
            )
            out.append(f"unknown field(s) ignored: {keys}")
        if self.unknown_kinds:
            kinds = ", ".join(f"{k} ({n})" for k, n in sorted(self.unknown_kinds.items()))
            out.append(f"unknown event kind(s) ignored: {kinds}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "files": self.files,
            "lines": self.lines,
            "malformed_lines": self.malformed,
            "torn_last_lines": self.torn,
            "malformed_examples": self.malformed_examples,
            "unknown_fields": self.unknown_keys,
            "unknown_field_files": self.unknown_key_files,
            "unknown_kinds": self.unknown_kinds,
            "rechecked_files": self.rechecked,
        }


def torn_tails(spark: SparkSession, files: list[Segment]) -> dict[str, str]:
    """file name -> its last line, for files whose last line is torn (no newline, not JSON)."""
    torn = {}
    for segment in files:
        if segment.size == 0:
            continue
        last_bytes = tail(spark, segment)
        if last_bytes.endswith(b"\n"):
            continue
        last = last_bytes.rpartition(b"\n")[2]
        try:
            event = json.loads(last)
            if isinstance(event, dict) and all(event.get(k) is not None for k in REQUIRED):
                continue  # complete, only the newline is missing
        except ValueError:
            pass
        torn[segment.name] = last.decode("utf-8", "replace")
    return torn


def width() -> Column:
    """Bytes the event's known fields take as compact JSON: `{"k":v,...}` without escapes."""
    from pyspark.sql import functions as F

    total = F.lit(1)  # the braces, less the comma the first field does not need
    for f in FIELDS:
        col = F.col(f.name)
        if f.type is str:
            value = F.octet_length(col) + 2
        elif f.type is int:
            value = F.octet_length(col.cast("string"))
        else:
            value = F.when(col, 4).when(~col, 5)
        total = total + F.coalesce(value + len(f.key), F.lit(0))  # ,"name":
    return total


def unknown_keys(spark: SparkSession, files: list[Segment]) -> list[Any]:
    """(key, lines, files) for every key outside the schema in any line of `files`."""
    from pyspark.sql import functions as F

    known = F.array(*[F.lit(k) for k in sorted(KNOWN_KEYS)])
    keys = F.array_except(F.json_object_keys("value"), known)
    return (
        spark.read.text([s.uri for s in files])
        .select(F.col("_metadata.file_name").alias("file"), F.explode(keys).alias("key"))
        .groupBy("key")
        .agg(
            F.count(F.lit(1)).alias("lines"),
            F.slice(F.array_sort(F.collect_set("file")), 1, FILES_PER_KEY).alias("files"),
        )
        .collect()
    )


def load(spark: SparkSession, directory: str | Path) -> History:
    """Read every segment under `directory` (a path, glob or URI: pipeline/segments.py);
    raises HistoryError when nothing is usable.

    The parsed events are kept by Spark (memory, spilling to disk) for the checks that follow;
    call `History.table.unpersist()` when done.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    files = list_segments(spark, directory)
    root = uri_of(directory)
    by_name: dict[str, list[Segment]] = defaultdict(list)
    for segment in files:
        by_name[segment.name].append(segment)
    names = sorted(by_name)
    # The file's index and writer run, by name: a join with this small table per event is
    # cheaper than taking the name apart per event.
    segments = spark.createDataFrame(
        [(name, i, _boot(name)) for i, name in enumerate(names)],
        "_name string, file int, boot long",
    )
    spark.conf.set("spark.sql.inMemoryColumnarStorage.compressed", "false")  # faster build
    raw = (
        spark.read.option("recursiveFileLookup", "true")
        .option("pathGlobFilter", "*.jsonl")
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt")
        .schema(schema().add(T.StructField("_corrupt", T.StringType())))
        .json(root)
    )
    raw = raw.select("*", F.col("_metadata.file_name").alias("_name")).join(
        F.broadcast(segments), "_name"
    )
    bad = F.col("_corrupt").isNotNull()
    for name in REQUIRED:
        bad = bad | F.col(name).isNull()
    key = F.coalesce(F.col("mid"), F.concat_ws(":", "node", F.col("msg_id").cast("string")))
    table = raw.select(
        *[name for name in COLUMNS if name != "mid"],
        key.alias("key"),
        "boot",
        "file",
        bad.alias("bad"),
        F.when(bad, F.coalesce("_corrupt", F.to_json(F.struct(*COLUMNS)))).alias("raw"),
        width().alias("width"),
    ).persist(StorageLevel.MEMORY_AND_DISK)

    internal = F.coalesce(F.col("queue").startswith("$"), F.lit(False))
    cells = (
        table.groupBy("file", "node", "boot", "bad", "kind")
        .agg(
            F.count(F.lit(1)).alias("lines"),
            F.count(F.when(~internal, 1)).alias("visible"),
            F.sum(F.col("width") + 1).alias("bytes"),
            F.max("ts_ns").alias("last"),
        )
        .collect()
    )
    history = History(root, table, files=len(files), table=table)
    read: dict[str, int] = defaultdict(int)
    malformed_in: set[str] = set()
    runs: dict[tuple[str, int, str], int] = {}
    for c in cells:
        name = names[c["file"]]
        history.lines += c["lines"]
        read[name] += c["bytes"] or 0
        if c["bad"]:
            history.malformed += c["lines"]
            malformed_in.add(name)
        elif c["kind"] not in KINDS:
            history.unknown_kinds[c["kind"]] = history.unknown_kinds.get(c["kind"], 0) + c["lines"]
        else:
            history.kinds[c["kind"]] = history.kinds.get(c["kind"], 0) + c["lines"]
            history.visible[c["kind"]] = history.visible.get(c["kind"], 0) + c["visible"]
            run = (c["node"], c["boot"], "client" if c["kind"] in CLIENT_KINDS else "node")
            runs[run] = max(runs.get(run, c["last"]), c["last"])
    history.runs = [(*run, end) for run, end in sorted(runs.items())]

    # A file adds up when its size is its lines' widths plus their newlines (the last newline
    # may be missing); the others are read again for their keys.
    recheck = [
        segment
        for name, segments in by_name.items()
        if name in malformed_in
        or not -len(segments) <= sum(s.size for s in segments) - read[name] <= 0
        for segment in segments
    ]
    history.rechecked = len(recheck)
    if recheck:
        for r in unknown_keys(spark, recheck):
            history.unknown_keys[r["key"]] = r["lines"]
            history.unknown_key_files[r["key"]] = r["files"]

    if history.malformed:
        tails = torn_tails(spark, [s for s in files if s.name in malformed_in])
        torn_cond = F.lit(False)
        for name, line in tails.items():
            torn_cond = torn_cond | ((F.col("file") == names.index(name)) & (F.col("raw") == line))
        history.torn = table.filter(F.col("bad") & torn_cond).count() if tails else 0
        history.malformed -= history.torn
        examples = (
            table.filter(F.col("bad") & ~torn_cond).select("file", "raw").limit(EXAMPLES).collect()
        )
        history.malformed_examples = [f"{names[r['file']]}: {_clip(r['raw'])}" for r in examples]
    if not history.kinds:
        table.unpersist()
        raise HistoryError(
            f"no valid audit events in {len(files)} segment(s) under {root} "
            f"({history.malformed} malformed line(s), {history.torn} torn)"
        )
    history.events = table.filter(~F.col("bad") & F.col("kind").isin(*KINDS)).select(
        *[name for name in COLUMNS if name != "mid"],
        "key",
        "boot",
        F.when(F.col("kind").isin(*CLIENT_KINDS), "client").otherwise("node").alias("source"),
        internal.alias("internal"),
    )
    return history


def _boot(name: str) -> int:
    match = SEGMENT_RE.match(name)
    return int(match["boot"]) if match else 0


def _clip(text: str | None, limit: int = 80) -> str:
    text = text or ""
    return text if len(text) <= limit else text[: limit - 3] + "..."
