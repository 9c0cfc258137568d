"""`pinmq check` on a history named by URI or glob, listed and read through Spark's Hadoop
layer (pipeline/segments.py): the same verdict as the plain path, only what a glob matches,
and one clear line, naming the scheme, when no filesystem serves a URI."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import run_check
from pipeline.segments import list_segments, tail, uri_of
from pipeline.synth import Inject, generate

pytestmark = pytest.mark.slow  # a Spark session, then seconds a check


def checked(history: str | Path, spark: Any, report: Path) -> tuple[int, dict[str, Any], str]:
    out = io.StringIO()
    code = run_check(history, spark=spark, report=report, out=out)
    return code, json.loads((report / "summary.json").read_text()), out.getvalue()


def test_a_file_uri_gives_the_plain_paths_verdict(spark: Any, tmp_path: Path) -> None:
    history = tmp_path / "history"
    generate(history, messages=2000, groups=20, inject=Inject(duplicates=2, order=1))
    code, by_path, _ = checked(history, spark, tmp_path / "by-path")
    uri = f"file://{history}"
    assert uri_of(history) == uri
    code_uri, by_uri, text = checked(uri, spark, tmp_path / "by-uri")
    assert code == code_uri == 1
    assert by_uri["violations"] == by_path["violations"]
    assert by_uri["violations"]["duplicates"] == 2 and by_uri["violations"]["order"] == 1
    assert by_uri["input"]["lines"] == by_path["input"]["lines"] > 0
    assert by_uri["input"]["directory"] == uri
    assert "FAIL duplicate deliveries: 2" in text


def test_a_glob_reads_only_what_it_matches(spark: Any, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    generate(runs / "run-a", messages=1000, groups=10)
    shutil.copytree(runs / "run-a", runs / "run-b")  # every message twice if it were read
    (runs / "scratch").mkdir()
    (runs / "scratch" / "n9-1-0.jsonl").write_text("not json\n")
    code, one, text = checked(f"file://{runs}/run-a", spark, tmp_path / "a")
    assert code == 0, text
    code, globbed, text = checked(f"file://{runs}/run-[a]", spark, tmp_path / "glob")
    assert code == 0, text
    assert globbed["input"]["lines"] == one["input"]["lines"]
    assert globbed["input"]["files"] == one["input"]["files"]
    assert not globbed["warnings"]  # the scratch directory's bad line was never read
    code, both, _ = checked(f"{runs}/run-*", spark, tmp_path / "both")  # a plain path's glob
    assert both["input"]["lines"] == 2 * one["input"]["lines"]
    assert code == 1 and both["violations"]["duplicates"] > 0


def test_a_torn_tail_is_read_through_hadoop(spark: Any, tmp_path: Path) -> None:
    history = tmp_path / "h"
    history.mkdir()
    segment = history / "n1-1-0.jsonl"
    segment.write_bytes(b'{"ts_ns":1}\n' * 10_000 + b'{"ts_ns":2,"no')
    [listed] = list_segments(spark, f"file://{history}")
    assert (listed.name, listed.size) == (segment.name, segment.stat().st_size)
    assert tail(spark, listed, 20) == b'"ts_ns":1}\n{"ts_ns":2,"no'[-20:]
    assert tail(spark, listed).endswith(b'{"ts_ns":2,"no') and len(tail(spark, listed)) == 1 << 16


@pytest.mark.parametrize(
    ("history", "said"),
    [
        ("s3a://pinmq-audit/run", "no Hadoop filesystem for s3a:// on Spark's classpath"),
        ("nosuch://host/run", "no Hadoop filesystem for nosuch:// on Spark's classpath"),
        ("file:///pinmq-none/*/x", "nothing matches file:///pinmq-none/*/x"),
    ],
)
def test_an_unreadable_uri_is_one_line_naming_why(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], history: str, said: str
) -> None:
    assert run_check(history, spark=spark, report=tmp_path / "r") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pinmq: error: {said}") and err.count("\n") == 1, err
    assert not (tmp_path / "r").exists()


def test_a_uri_without_a_report_directory_is_refused_before_spark_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_check("hdfs://namenode/audit", master="not-a-master") == 2
    assert capsys.readouterr().err == (
        "pinmq: error: --report DIR is needed: summary.json cannot go to hdfs://namenode/audit\n"
    )
