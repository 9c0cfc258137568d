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

from pipeline import history as history_module
from pipeline.cli import run_check
from pipeline.history import schema
from pipeline.segments import HistoryError, file_path, read, segment, tail, uri_of
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
    segment_file = history / "n1-1-0.jsonl"
    segment_file.write_bytes(b'{"ts_ns":1}\n' * 10_000 + b'{"ts_ns":2,"no')
    _, [path] = read(spark, f"file://{history}", schema())
    listed = segment(path, segment_file.stat().st_size)
    assert (listed.uri, listed.name) == (f"file:{history}/n1-1-0.jsonl", segment_file.name)
    assert tail(spark, listed, 20) == b'"ts_ns":1}\n{"ts_ns":2,"no'[-20:]
    assert tail(spark, listed).endswith(b'{"ts_ns":2,"no') and len(tail(spark, listed)) == 1 << 16


@pytest.mark.parametrize(
    ("listed", "spelled"),
    [
        ("file:///srv/audit/a%20b.jsonl", "file:/srv/audit/a%20b.jsonl"),
        ("hdfs://namenode:8020/audit/n1-1-0.jsonl", "hdfs://namenode:8020/audit/n1-1-0.jsonl"),
        ("s3a://bucket/audit/n1-1-0.jsonl", "s3a://bucket/audit/n1-1-0.jsonl"),
    ],
)
def test_a_listed_uri_is_spelled_as_spark_names_the_file_it_reads(
    listed: str, spelled: str
) -> None:
    """The join of each event to its file's index is on this spelling."""
    assert file_path(listed) == spelled


def test_files_whose_names_need_escaping_are_read_and_named(spark: Any, tmp_path: Path) -> None:
    """Spark spells such a file's path URL-encoded; none of its events may be lost on the way."""
    plain = tmp_path / "plain"
    generate(plain, messages=500, groups=5)
    odd = tmp_path / "odd"
    for i, source in enumerate(sorted(plain.glob("*.jsonl"))):
        target = odd / "run 1%" / source.name.replace("-", f" {i}% -", 1)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
    with (odd / "run 1%" / "n9 x%.jsonl").open("w") as torn:
        torn.write('{"ts_ns":1,"node":"n9","kind":"sent"}\n{"ts_ns":2,"no')
    code, by_plain, _ = checked(plain, spark, tmp_path / "r-plain")
    code_odd, by_odd, text = checked(odd, spark, tmp_path / "r-odd")
    assert code == code_odd == 0, text
    assert by_odd["input"]["lines"] == by_plain["input"]["lines"] + 2
    assert by_odd["input"]["files"] == by_plain["input"]["files"] + 1
    assert by_odd["input"]["torn_last_lines"] == 1 and by_odd["input"]["malformed_lines"] == 0


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


def test_events_of_a_file_the_listing_did_not_name_fail_the_load(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were a path spelled one way by the listing and another by Spark's `file_path`, the
    join of events to files would leave that file's events without one: the load fails
    loudly rather than check a history short of them."""
    generate(tmp_path / "history", messages=200, groups=2)

    def short_listing(*args: Any) -> tuple[Any, list[str]]:
        frame, paths = read(*args)
        return frame, paths[1:]

    monkeypatch.setattr(history_module, "read", short_listing)
    with pytest.raises(HistoryError, match="that its listing did not name"):
        history_module.load(spark, tmp_path / "history")
