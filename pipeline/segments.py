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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SUFFIX = ".jsonl"
TAIL_BYTES = 1 << 16  # enough for the longest line the writers write
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
GLOB = re.compile(r"[*?\[{]")


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


def list_segments(spark: SparkSession, history: str | Path) -> list[Segment]:
    """Every `*.jsonl` file under the history (a directory, recursively, or what a glob
    matches), in name order; HistoryError when there is nothing to check."""
    uri = uri_of(history)
    with _hadoop(uri):
        path = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(uri)
        fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        matched = fs.globStatus(path)
        if not matched:
            if GLOB.search(uri):
                raise HistoryError(f"nothing matches {history}")
            raise HistoryError(f"history directory {history} does not exist")
        if len(matched) == 1 and not matched[0].isDirectory() and not GLOB.search(uri):
            raise HistoryError(f"{history} is not a directory")
        found = []
        for status in matched:
            if status.isDirectory():
                listing = fs.listFiles(status.getPath(), True)
                while listing.hasNext():
                    found.append(listing.next())
            else:
                found.append(status)
        files = sorted(
            (
                Segment(f.getPath().toString(), f.getPath().getName(), f.getLen())
                for f in found
                if f.isFile() and f.getPath().getName().endswith(SUFFIX)
            ),
            key=lambda s: (s.name, s.uri),
        )
    if not files:
        raise HistoryError(f"no audit segments (*{SUFFIX}) under {history}")
    if all(s.size == 0 for s in files):
        raise HistoryError(f"the {len(files)} audit segment(s) under {history} are empty")
    return files


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
