"""`pinmq check --cache DIR` (pipeline/cache.py): the parsed events kept as Parquet are what a
second check of the same segments reads, with the verdict and counts of a check without it;
a segment added or grown converts the history again and its events count; names Spark
URL-encodes are matched; a cache that cannot be written is one line and exit code 2."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pipeline import job
from pipeline.cli import run_check
from pipeline.segments import HistoryError
from pipeline.synth import Inject, generate

pytestmark = pytest.mark.slow  # a Spark session, then seconds a check


def same(a: job.Result, b: job.Result) -> None:
    """The same verdict, counts, input and statistics (the check's own time aside)."""
    assert a.counts == b.counts
    assert {k: v for k, v in a.history.to_json().items() if k != "cache"} == {
        k: v for k, v in b.history.to_json().items() if k != "cache"
    }
    assert a.stats == b.stats


def test_a_second_check_reads_the_cache_and_says_what_the_first_said(
    spark: Any, tmp_path: Path
) -> None:
    history, cache = tmp_path / "h", tmp_path / "cache"
    generate(history, messages=3000, groups=30, failover=True, inject=Inject(duplicates=2))
    (history / "n7-3-0.jsonl").write_text("")  # a node that wrote nothing (a REMOTE one, idle)
    plain = job.run(spark, history)
    first = job.run(spark, history, cache=cache)
    assert first.history.cache == "converted"
    assert (cache / "events").is_dir() and (cache / "segments").is_dir()
    second = job.run(spark, history, cache=cache)
    assert second.history.cache == "reused"
    assert plain.history.cache is None and plain.counts["duplicates"] == 2
    same(plain, first)
    same(plain, second)
    # What is read is the cache: with the Parquet gone, the reused manifest fails loudly.
    shutil.rmtree(cache / "events")
    with pytest.raises(HistoryError, match=r"cannot use the cache .*events"):
        job.run(spark, history, cache=cache)


def test_a_segment_grown_or_added_converts_again_and_its_events_count(
    spark: Any, tmp_path: Path
) -> None:
    history, cache = tmp_path / "h", tmp_path / "cache"
    generate(history, messages=2000, groups=20)
    assert job.run(spark, history, cache=cache).clean
    node = next(history.glob("n1-*.jsonl"))
    lines = node.read_text().splitlines(keepends=True)
    delivered = next(line for line in reversed(lines) if '"kind":"delivered"' in line)
    acked = next(
        line
        for line in reversed(lines)
        if '"kind":"acked"' in line
        and json.loads(line)["msg_id"] == json.loads(delivered)["msg_id"]
    )
    late = json.loads(acked)["ts_ns"] + 1_000_000
    again = [
        json.dumps({**json.loads(e), "ts_ns": late + i, "n": 10**9 + i}, separators=(",", ":"))
        for i, e in enumerate((delivered, acked))
    ]
    with node.open("a") as grown:  # the same message delivered and acked once more
        grown.write("\n".join(again) + "\n")
    result = job.run(spark, history, cache=cache)
    assert result.history.cache == "converted"
    assert result.counts["duplicates"] == 1
    assert job.run(spark, history, cache=cache).history.cache == "reused"
    (history / "n9-5-0.jsonl").write_text('{"ts_ns":1,"node":"n9","kind":"sent"}\n')
    result = job.run(spark, history, cache=cache)
    assert result.history.cache == "converted"
    assert result.history.files == len(list(history.glob("*.jsonl")))
    assert result.history.kinds["sent"] == job.run(spark, history).history.kinds["sent"]


def test_names_spark_encodes_are_matched_to_the_listing(spark: Any, tmp_path: Path) -> None:
    history, cache = tmp_path / "run 1%", tmp_path / "cache 2%"
    generate(history, messages=500, groups=5)
    for source in history.glob("*.jsonl"):
        source.rename(source.with_name(source.name.replace("-", " x% -", 1)))
    assert job.run(spark, history, cache=cache).history.cache == "converted"
    assert job.run(spark, history, cache=cache).history.cache == "reused"


def test_a_cache_that_cannot_be_written_is_one_line_and_exit_2(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = tmp_path / "h"
    generate(history, messages=200, groups=2)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    out = io.StringIO()
    assert run_check(history, spark=spark, cache=blocker / "cache", out=out) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pinmq: error: cannot use the cache {blocker / 'cache'}: ")
    assert len(err.strip().splitlines()) == 1
