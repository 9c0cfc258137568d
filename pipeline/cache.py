"""A history's parsed events kept as Parquet (`pinmq check --cache DIR`), for the next check.

Spark's JSON reader and the in-memory cache it fills are most of a check's time
(bench/RESULTS.md): a history checked again (a report looked at once more, a check re-run after
a drill) need not pay them twice. The cache is a directory, a path or a Hadoop URI (shared
storage when the executors are on other machines), that holds `events/` (the load's table,
Parquet) and `segments/` (the manifest: each segment's path, as Spark spells it, and its size as
read). It is used only when the history's segments are exactly those, by path and size: a
segment added, removed, or grown since (a live cluster's) converts the whole history again. The
manifest is removed before a conversion and written after it, so an interrupted one is never
used; reading the Parquet back, the checks take only the columns they need.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from pipeline.segments import SUFFIX, HistoryError, uri_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

MANIFEST = "path string, size long"


def listed_sizes(spark: SparkSession, history: str) -> dict[str, int]:
    """Each segment's size by its decoded path (`file:/a b/x.jsonl`), in one listing job:
    Spark's binary-file source lists files and reads none when no content is asked for. It
    leaves out empty files (no split to read): a listed segment it does not name has size 0,
    or it went away since (a manifest that had rows of it then differs)."""
    rows = (
        spark.read.format("binaryFile")
        .option("recursiveFileLookup", "true")
        .option("pathGlobFilter", f"*{SUFFIX}")
        .load(history)
        .select("path", "length")
        .collect()
    )
    return {r["path"]: r["length"] for r in rows}


def table(
    spark: SparkSession, cache: str | Path, history: str, paths: list[str], parsed: DataFrame
) -> tuple[DataFrame, bool]:
    """The events of the history `history` whose segments are `paths` (Spark's `file_path`s):
    the cache's when its manifest names exactly those at their present sizes, else `parsed`
    written there first. True when it was converted (then `seal` it with the sizes read)."""
    root = uri_of(cache)
    with _errors(cache):
        listed = listed_sizes(spark, history)
        now = {path: listed.get(unquote(path), 0) for path in paths}
        if _manifest(spark, root) == now:
            return spark.read.parquet(f"{root}/events"), False
        _delete(spark, f"{root}/segments")
        parsed.write.mode("overwrite").parquet(f"{root}/events")
        return spark.read.parquet(f"{root}/events"), True


def seal(spark: SparkSession, cache: str | Path, sizes: dict[str, int]) -> None:
    """Write the manifest of a conversion: each segment's `file_path` and the size read."""
    with _errors(cache):
        frame = spark.createDataFrame(sorted(sizes.items()), MANIFEST).coalesce(1)
        frame.write.mode("overwrite").json(f"{uri_of(cache)}/segments")


@contextmanager
def _errors(cache: str | Path) -> Iterator[None]:
    """Spark's and Hadoop's errors on the cache as one line (a directory not writable, say)."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    try:
        yield
    except (Py4JJavaError, PySparkException) as err:
        text = str(err.java_exception.toString()) if isinstance(err, Py4JJavaError) else str(err)
        first = (text.strip().splitlines() or [type(err).__name__])[0]
        raise HistoryError(f"cannot use the cache {cache}: {first}") from None


def _manifest(spark: SparkSession, root: str) -> dict[str, int] | None:
    path = f"{root}/segments"
    if not _exists(spark, path):
        return None
    rows = spark.read.schema(MANIFEST).json(path).collect()
    return {r["path"]: r["size"] for r in rows}


def _fs(spark: SparkSession, uri: str) -> tuple[Any, Any]:
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path


def _exists(spark: SparkSession, uri: str) -> bool:
    fs, path = _fs(spark, uri)
    return bool(fs.exists(path))


def _delete(spark: SparkSession, uri: str) -> None:
    fs, path = _fs(spark, uri)
    fs.delete(path, True)
