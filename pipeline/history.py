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
from pipeline import cache as events_cache
from pipeline.segments import HistoryError, Segment, name_of, read, segment, sizes, tail, uri_of

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
    cache: str | None = None  # with a cache: "converted" this time, or "reused"

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
            "cache": self.cache,
        }


def torn_tails(spark: SparkSession, files: dict[int, Segment]) -> dict[int, str]:
    """file -> its last line, for files whose last line is torn (no newline, not JSON)."""
    torn = {}
    for file, one in files.items():
        if one.size == 0:
            continue
        last_bytes = tail(spark, one)
        if last_bytes.endswith(b"\n"):
            continue
        last = last_bytes.rpartition(b"\n")[2]
        try:
            event = json.loads(last)
            if isinstance(event, dict) and all(event.get(k) is not None for k in REQUIRED):
                continue  # complete, only the newline is missing
        except ValueError:
            pass
        torn[file] = last.decode("utf-8", "replace")
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


def load(spark: SparkSession, directory: str | Path, cache: str | Path | None = None) -> History:
    """Read every segment under `directory` (a path, glob or URI: pipeline/segments.py);
    raises HistoryError when nothing is usable.

    The parsed events are kept by Spark (memory, spilling to disk) for the checks that follow;
    call `History.table.unpersist()` when done. With `cache` (a directory: pipeline/cache.py)
    they are kept there as Parquet instead, and read from there while the segments are the same.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    raw, paths = read(spark, directory, schema().add(T.StructField("_corrupt", T.StringType())))
    root = uri_of(directory)
    names = [name_of(path) for path in paths]
    # The file's index and writer run, by path: a join with this small table per event is
    # cheaper than taking the name apart per event. A left join, so that an event of a file
    # the listing did not name (a path spelled otherwise) is not dropped but fails the load.
    segments = spark.createDataFrame(
        [(path, i, _boot(name)) for i, (path, name) in enumerate(zip(paths, names, strict=True))],
        "_path string, file int, boot long",
    )
    raw = raw.select(
        "*",
        F.col("_metadata.file_path").alias("_path"),
        F.col("_metadata.file_size").alias("size"),
    ).join(F.broadcast(segments), "_path", "left")
    bad = F.col("_corrupt").isNotNull()
    for name in REQUIRED:
        bad = bad | F.col(name).isNull()
    key = F.coalesce(F.col("mid"), F.concat_ws(":", "node", F.col("msg_id").cast("string")))
    table = raw.select(
        *[name for name in COLUMNS if name != "mid"],
        key.alias("key"),
        "boot",
        "file",
        "size",
        bad.alias("bad"),
        F.when(bad, F.coalesce("_corrupt", F.to_json(F.struct(*COLUMNS)))).alias("raw"),
        width().alias("width"),
    )
    converted = False
    # The checks keep their intermediate tables in memory too: uncompressed, they are built
    # faster (bench/RESULTS.md), and spill to disk when memory runs short.
    spark.conf.set("spark.sql.inMemoryColumnarStorage.compressed", "false")
    if cache is None:
        table = table.persist(StorageLevel.MEMORY_AND_DISK)
    else:
        table, converted = events_cache.table(spark, cache, root, paths, table)

    internal = F.coalesce(F.col("queue").startswith("$"), F.lit(False))
    cells = (
        table.groupBy("file", "node", "boot", "bad", "kind")
        .agg(
            F.count(F.lit(1)).alias("lines"),
            F.count(F.when(~internal, 1)).alias("visible"),
            F.sum(F.col("width") + 1).alias("bytes"),
            F.max("ts_ns").alias("last"),
            F.max("size").alias("size"),
        )
        .collect()
    )
    history = History(root, table, files=len(paths), table=table)
    history.cache = None if cache is None else ("converted" if converted else "reused")
    read_bytes: dict[int, int] = defaultdict(int)
    size: dict[int, int] = {}
    malformed_in: set[int] = set()
    runs: dict[tuple[str, int, str], int] = {}
    for c in cells:
        if c["file"] is None:
            table.unpersist()
            raise HistoryError(f"Spark read a segment under {root} that its listing did not name")
        history.lines += c["lines"]
        read_bytes[c["file"]] += c["bytes"] or 0
        size[c["file"]] = c["size"]
        if c["bad"]:
            history.malformed += c["lines"]
            malformed_in.add(c["file"])
        elif c["kind"] not in KINDS:
            history.unknown_kinds[c["kind"]] = history.unknown_kinds.get(c["kind"], 0) + c["lines"]
        else:
            history.kinds[c["kind"]] = history.kinds.get(c["kind"], 0) + c["lines"]
            history.visible[c["kind"]] = history.visible.get(c["kind"], 0) + c["visible"]
            run = (c["node"], c["boot"], "client" if c["kind"] in CLIENT_KINDS else "node")
            runs[run] = max(runs.get(run, c["last"]), c["last"])
    history.runs = [(*run, end) for run, end in sorted(runs.items())]

    # A file adds up when its size is its lines' widths plus their newlines (the last newline
    # may be missing); the others are read again for their keys. A file without a line (empty,
    # or blank lines only) has its size asked of Hadoop.
    unread = [i for i in range(len(paths)) if i not in size]
    size.update(zip(unread, sizes(spark, [paths[i] for i in unread]), strict=True))
    recheck = [
        segment(paths[i], size[i])
        for i in range(len(paths))
        if i in malformed_in or not -1 <= size[i] - read_bytes[i] <= 0
    ]
    history.rechecked = len(recheck)
    if converted:
        events_cache.seal(spark, cache, {path: size[i] for i, path in enumerate(paths)})
    if recheck:
        for r in unknown_keys(spark, recheck):
            history.unknown_keys[r["key"]] = r["lines"]
            history.unknown_key_files[r["key"]] = r["files"]

    if history.malformed:
        tails = torn_tails(spark, {i: segment(paths[i], size[i]) for i in sorted(malformed_in)})
        torn_cond = F.lit(False)
        for file, line in tails.items():
            torn_cond = torn_cond | ((F.col("file") == file) & (F.col("raw") == line))
        history.torn = table.filter(F.col("bad") & torn_cond).count() if tails else 0
        history.malformed -= history.torn
        examples = (
            table.filter(F.col("bad") & ~torn_cond).select("file", "raw").limit(EXAMPLES).collect()
        )
        history.malformed_examples = [f"{names[r['file']]}: {_clip(r['raw'])}" for r in examples]
    if not history.kinds:
        table.unpersist()
        if not any(size.values()):
            raise HistoryError(f"the {len(paths)} audit segment(s) under {directory} are empty")
        raise HistoryError(
            f"no valid audit events in {len(paths)} segment(s) under {root} "
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
