"""The SparkSession the checker runs on: quiet, sized for one machine unless given a master."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


_PARTITIONS = "spark.sql.shuffle.partitions"


class SparkUnavailable(Exception):
    """pyspark is not installed or Spark cannot start (no Java): one line saying which."""


def session(master: str = DEFAULT_MASTER, app: str = "pinmq-check") -> SparkSession:
    """A SparkSession on `master`; SparkUnavailable when Spark cannot start."""
    if master.startswith("local"):  # a cluster's executors must reach the driver, with their Python
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkUnavailable(
            "pinmq check needs pyspark: pip install 'pinmq[check]' (and Java 17+)"
        ) from None
    log4j = Path(tempfile.gettempdir()) / "pinmq-check-log4j2.properties"
    if not log4j.exists() or log4j.read_text() != _LOG4J:
        log4j.write_text(_LOG4J)
    options = f"-Dlog4j2.configurationFile=file:{log4j}"
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if master.startswith("local"):
        builder = builder.config("spark.driver.memory", os.environ.get("PINMQ_SPARK_MEMORY", "4g"))
        builder = builder.config("spark.sql.shuffle.partitions", str(2 * _cores(master)))
        builder = builder.config("spark.sql.inMemoryColumnarStorage.batchSize", "20000")
        # Measured on 10M events (bench/RESULTS.md): one machine's few shuffle partitions
        # leave adaptive execution nothing to coalesce, and it makes each read of the cached
        # history a stage of its own, so the load's counting cannot share the pass that builds
        # the cache; the parallel collector serves a batch job's throughput better than G1.
        builder = builder.config("spark.sql.adaptive.enabled", "false")
        options += " -XX:+UseParallelGC"
    builder = builder.config("spark.driver.extraJavaOptions", options)
    try:
        spark = builder.getOrCreate()
    except Exception as err:  # no Java, a bad master URL, ...: one line, no trace
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SparkUnavailable(f"cannot start Spark on {master}: {first}") from None
    spark.sparkContext.setLogLevel("ERROR")
    if not master.startswith("local") and not spark.sparkContext.getConf().contains(_PARTITIONS):
        # Spark's 200 are for big clusters: on a few workers their tasks' overhead is most of
        # a check (a 140k-event history took 261 s on two one-core workers).
        cores = spark.sparkContext.defaultParallelism
        spark.conf.set(_PARTITIONS, str(2 * cores))
    return spark


def _cores(master: str) -> int:
    """The worker threads of a `local`, `local[N]`, `local[*]` or `local[N,retries]` master."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master)
    if not match or not match[1]:
        return 1
    return (os.cpu_count() or 1) if match[1] == "*" else int(match[1])
