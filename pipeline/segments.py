"""A history's segment files, found and read through Spark's Hadoop filesystem layer.

The history is a directory, a glob or a URI of any filesystem Hadoop reads where Spark runs
(`file://`, `hdfs://`, `s3a://` with its jars): the driver lists it through Hadoop, and the
executors read the files they are given by URI, so a history on shared storage is checked by
a cluster whose machines never see the driver's disk. A path without a scheme is a local one
(made absolute: on a cluster it must be where every executor sees it too).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SUFFIX = ".jsonl"
TAIL_BYTES = 1 << 16  # enough for the longest line the writers write
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
GLOB = re.compile(r"[*?\[{]")
_EMPTY_AUTHORITY = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):///")


class HistoryError(Exception):
    """The history cannot be checked (a user error): the message says why, in one line."""


@dataclass(frozen=True)
class Segment:
    """One segment file: its URI (what Spark reads), its name and its size in bytes."""

    uri: str
    name: str
    size: int


def uri_of(history: str | Path) -> str:
    """The history as a Hadoop URI: a path without a scheme is a local one, made absolute."""
    text = str(history)
    return text if _SCHEME.match(text) else f"file://{Path(text).absolute()}"


def local_path(history: str | Path) -> Path | None:
    """The local directory a history names (a plain path or a `file:` URI), else None."""
    text = str(history)
    if not _SCHEME.match(text):
        return Path(text)
    if text.startswith("file:"):
        return Path(re.sub(r"^file:(//[^/]*)?", "", text))
    return None


def read(spark: SparkSession, history: str | Path, schema: Any) -> tuple[DataFrame, list[str]]:
    """Every `*.jsonl` file under the history (a directory, recursively, or what a glob
    matches) as one JSON-lines DataFrame with `schema` (a line that does not parse in
    `_corrupt`, which `schema` must hold), and the files it reads as Spark's `file_path`s.

    Spark lists the files once, for both, in one call: a round trip per file through py4j
    costs about 5 ms, seconds on a long history. HistoryError when there is nothing to read.
    """
    uri = uri_of(history)
    with _hadoop(uri):
        _check_root(spark, uri, history)
        frame = (
            spark.read.option("recursiveFileLookup", "true")
            .option("pathGlobFilter", f"*{SUFFIX}")
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", "_corrupt")
            .schema(schema)
            .json(uri)
        )
        paths = sorted((file_path(listed) for listed in frame.inputFiles()), key=_by_name)
    if not paths:
        raise HistoryError(f"no audit segments (*{SUFFIX}) under {history}")
    return frame, paths


def file_path(uri: str) -> str:
    """A listed file's URI as Spark's `_metadata.file_path` spells it (`file:/x`, not
    `file:///x`; still URL-encoded)."""
    return _EMPTY_AUTHORITY.sub(r"\1:/", uri)


def name_of(path: str) -> str:
    """The file name in a `file_path`, decoded."""
    return unquote(path.rpartition("/")[2])


def segment(path: str, size: int) -> Segment:
    """The segment at a `file_path`, addressed as Hadoop's `Path(String)` reads it."""
    return Segment(unquote(path), name_of(path), size)


def sizes(spark: SparkSession, paths: list[str]) -> list[int]:
    """Each file's size, asked of Hadoop one round trip a file: only for a few files."""
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    found = []
    for path in paths:
        with _hadoop(path):
            jpath = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(unquote(path))
            found.append(jpath.getFileSystem(conf).getFileStatus(jpath).getLen())
    return found


def _check_root(spark: SparkSession, uri: str, history: str | Path) -> None:
    """A missing history or a plain file is a user's error, said as one: Spark would read a
    missing directory as an empty one."""
    path = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(uri)
    matched = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).globStatus(path)
    if not matched:
        if GLOB.search(uri):
            raise HistoryError(f"nothing matches {history}")
        raise HistoryError(f"history directory {history} does not exist")
    if len(matched) == 1 and not matched[0].isDirectory() and not GLOB.search(uri):
        raise HistoryError(f"{history} is not a directory")


def _by_name(path: str) -> tuple[str, str]:
    return name_of(path), path


def tail(spark: SparkSession, segment: Segment, limit: int = TAIL_BYTES) -> bytes:
    """The last `limit` bytes of a segment, read through Hadoop."""
    jvm = spark.sparkContext._jvm
    start = max(0, segment.size - limit)
    with _hadoop(segment.uri):
        path = jvm.org.apache.hadoop.fs.Path(segment.uri)
        stream = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).open(path)
        try:
            stream.seek(start)
            return bytes(
                jvm.org.apache.commons.io.IOUtils.toByteArray(stream, segment.size - start)
            )
        finally:
            stream.close()


@contextmanager
def _hadoop(uri: str) -> Iterator[None]:
    """Hadoop's errors as one-line HistoryErrors; a missing filesystem names its scheme."""
    from py4j.protocol import Py4JJavaError

    try:
        yield
    except Py4JJavaError as err:
        java = err.java_exception
        text = str(java.toString())
        if "UnsupportedFileSystemException" in text or "ClassNotFoundException" in text:
            scheme = uri.split(":", 1)[0]
            raise HistoryError(
                f"no Hadoop filesystem for {scheme}:// on Spark's classpath (its jars are "
                f"missing: hadoop-aws and its SDK for s3a, say): cannot read {uri}"
            ) from None
        raise HistoryError(f"cannot read {uri}: {text.splitlines()[0]}") from None
