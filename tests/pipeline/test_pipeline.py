"""The PySpark checker on real Spark (`local[2]`, one SparkSession for the whole module).

Synthetic histories (pipeline/synth.py) carry each kind of violation with a known count; the
checker must report exactly that count and nothing else, agree with the pure-Python reference,
and call a clean history clean. Bad input gets one clear line and exit code 2. A history
recorded by a real three-node cluster with grouped load through every node is checked clean.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline import job, pure
from pipeline.cli import run_check
from pipeline.history import HistoryError, load
from pipeline.synth import Inject, generate

pytestmark = pytest.mark.slow  # a Spark session, then seconds a check

VIOLATIONS = ("lost", "duplicates", "order", "exclusivity", "routing")
NONE = dict.fromkeys(VIOLATIONS, 0)


# ---- synthetic histories ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "count"),
    [("lost", 3), ("duplicates", 2), ("order", 4), ("exclusivity", 5), ("routing", 2)],
)
def test_each_injected_violation_is_found_with_its_exact_count(
    spark: Any, tmp_path: Path, kind: str, count: int
) -> None:
    generate(tmp_path, messages=3000, groups=40, releases=2, inject=Inject(**{kind: count}))
    result = job.run(spark, tmp_path, with_stats=False)
    assert result.counts == {**NONE, kind: count}
    assert pure.check(tmp_path) == result.counts
    assert len(result.examples[kind]) == count
    assert not result.clean


def test_all_kinds_at_once_are_counted_apart_and_listed_with_their_events(
    spark: Any, tmp_path: Path
) -> None:
    injected = Inject(lost=1, duplicates=2, order=3, exclusivity=4, routing=5)
    generate(tmp_path, messages=6000, groups=60, failover=True, inject=injected)
    result = job.run(spark, tmp_path, with_stats=False)
    assert result.counts == {"lost": 1, "duplicates": 2, "order": 3, "exclusivity": 4, "routing": 5}
    assert pure.check(tmp_path) == result.counts
    lost = result.examples["lost"][0]
    sent = [e for e in result.events[lost["key"]] if e["kind"] == "client_sent"]
    assert (lost["ts_ns"], lost["group"]) == (sent[0]["ts_ns"], sent[0]["group"])  # its first
    assert lost["producer"] and lost["msg_id"] is not None
    kinds = [e["kind"] for e in result.events[lost["key"]]]
    assert "sent" in kinds and "delivered" not in kinds  # confirmed, never delivered
    dup = result.examples["duplicates"][0]
    assert dup["previous_event"] == "acked"
    assert [e["kind"] for e in result.events[dup["key"]]].count("delivered") == 2
    order = result.examples["order"][0]
    assert order["before_seq"] == order["group_seq"] - 1
    assert order["settled_ts_ns"] < order["before_settled_ts_ns"]
    assert all(len(r["targets"]) == 2 and r["epoch"] == 1 for r in result.examples["routing"])


def test_a_clean_history_is_clean_with_statistics(spark: Any, tmp_path: Path) -> None:
    generate(tmp_path, messages=6000, groups=60, releases=5, failover=True)
    result = job.run(spark, tmp_path)
    assert result.counts == NONE and result.clean
    assert pure.check(tmp_path) == NONE
    s = result.stats
    assert s["events"]["client_sent"] == 6000 and s["events"]["released"] == 5
    assert [n["node"] for n in s["per_node"]] == ["n1", "n2", "n3"]
    assert sum(n["messages"] for n in s["per_node"]) == 6000
    assert len(s["per_consumer"]) == 6
    assert s["group_sizes"]["groups"] == 60 and s["group_sizes"]["max"] == 100
    assert s["skew"]["messages_per_consumer"] >= 1.0
    # 60 first decisions in epoch 1, and one per group n3 held when it failed (epoch 2).
    assert s["decision_latency_ms"]["count"] == 60 + 20
    gaps = {g["what"]: g for g in s["failovers"]}
    assert set(gaps) == {"node n3 stopped", "epoch 2 began"}  # n1, n2 ran to the end
    assert gaps["node n3 stopped"]["gap_ms"] >= 2000  # the synthetic pause
    assert gaps["node n3 stopped"]["group_gap_ms"] >= 2000  # n3's groups waited it out
    assert gaps["node n3 stopped"]["groups_stalled"] >= 1
    assert s["stalls"]["groups"] >= 1 and s["stalls"]["longest"][0]["gap_ms"] >= 2000
    assert gaps["epoch 2 began"]["gap_ms"] >= 2000
    assert set(s["timeline"]["series"]) == {"n1", "n2", "n3"}


def test_client_events_alone_are_enough(spark: Any, tmp_path: Path) -> None:
    generate(tmp_path, messages=2000, groups=20, inject=Inject(lost=2, order=1))
    for path in tmp_path.glob("n*.jsonl"):
        path.unlink()  # the nodes did not audit
    result = job.run(spark, tmp_path, with_stats=False)
    assert result.counts == {**NONE, "lost": 2, "order": 1}
    assert pure.check(tmp_path) == result.counts
    assert "no routed events: routing consistency not checked" in result.notes


def _line(**event: Any) -> str:
    return json.dumps({k: v for k, v in event.items() if v is not None}) + "\n"


def _write(path: Path, *events: dict[str, Any]) -> None:
    path.write_text("".join(_line(n=i + 1, **e) for i, e in enumerate(events)))


def test_redelivery_after_a_crash_is_neither_a_duplicate_nor_shared(
    spark: Any, tmp_path: Path
) -> None:
    base = {"node": "n1", "queue": "q", "address": "q", "group": "g", "mid": "p/1"}
    first = {**base, "group_seq": 1}
    # Run 1 delivers p/1 to c1 and dies with it unacked; run 2 delivers it to c2, who acks.
    _write(
        tmp_path / "n1-100-0.jsonl",
        {"ts_ns": 1000, "kind": "sent", **first},
        {"ts_ns": 1100, "kind": "delivered", "consumer": "c1", "delivery_count": 1, **first},
    )
    _write(
        tmp_path / "n1-200-0.jsonl",
        {"ts_ns": 5000, "kind": "delivered", "consumer": "c2", "delivery_count": 1, **first},
        {"ts_ns": 5100, "kind": "acked", "consumer": "c2", **first},
    )
    _write(
        tmp_path / "client-1-50-0.jsonl",
        {"ts_ns": 1050, "kind": "client_sent", "node": "h:1", "mid": "p/1", "address": "q"},
    )
    result = job.run(spark, tmp_path, with_stats=False)
    assert result.counts == NONE
    assert pure.check(tmp_path) == NONE
    # The same second delivery within one run, with no release, is a duplicate and shared.
    (tmp_path / "n1-200-0.jsonl").unlink()
    _write(
        tmp_path / "n1-100-0.jsonl",
        {"ts_ns": 1000, "kind": "sent", **first},
        {"ts_ns": 1100, "kind": "delivered", "consumer": "c1", "delivery_count": 1, **first},
        {"ts_ns": 5000, "kind": "delivered", "consumer": "c2", "delivery_count": 1, **first},
        {"ts_ns": 5100, "kind": "acked", "consumer": "c2", **first},
    )
    result = job.run(spark, tmp_path, with_stats=False)
    assert result.counts == {**NONE, "duplicates": 1, "exclusivity": 1}
    assert pure.check(tmp_path) == result.counts


def test_routing_is_per_queue_and_a_removed_binding_may_be_replaced(
    spark: Any, tmp_path: Path
) -> None:
    def routed(ts: int, queue: str, target: str) -> dict[str, Any]:
        return {"ts_ns": ts, "node": "n2", "kind": "routed", "epoch": 1, "address": "news",
                "queue": queue, "group": "g", "target": f"{queue}@{target}"}  # fmt: skip

    removal = {"ts_ns": 300, "node": "n1", "kind": "unbound", "epoch": 1, "queue": "news.a",
               "group": "g", "target": "news.a@n2", "reason": "reaped"}  # fmt: skip
    # Multicast: the group's copies bound on two queues, each to its own node; then news.a's
    # binding is removed and the group bound again elsewhere.
    _write(
        tmp_path / "n2-1-0.jsonl",
        routed(100, "news.a", "n2"), routed(110, "news.b", "n3"), routed(120, "news.a", "n2"),
        routed(400, "news.a", "n3"), routed(410, "news.b", "n3"),
    )  # fmt: skip
    _write(tmp_path / "n1-1-0.jsonl", removal)
    assert job.run(spark, tmp_path, with_stats=False).counts["routing"] == 0
    assert pure.check(tmp_path)["routing"] == 0
    # Without the removal, news.a's group names two nodes within its one binding.
    (tmp_path / "n1-1-0.jsonl").unlink()
    result = job.run(spark, tmp_path, with_stats=False)
    assert result.counts["routing"] == 1
    example = result.examples["routing"][0]
    assert example["targets"] == ["news.a@n2", "news.a@n3"]
    assert (example["address"], example["events"]) == ("news", 3)  # every route of it, once
    assert pure.check(tmp_path)["routing"] == 1


def test_an_order_break_is_explained_by_the_removal_before_it_and_accepted_when_moved(
    spark: Any, tmp_path: Path
) -> None:
    from pipeline.report import render

    base = {"queue": "q", "address": "q", "group": "g", "producer": "p"}
    one, two = {**base, "mid": "p/1", "group_seq": 1}, {**base, "mid": "p/2", "group_seq": 2}
    removal = {"ts_ns": 2000, "node": "n1", "kind": "unbound", "epoch": 1, "queue": "q",
               "group": "g", "target": "q@n3", "reason": "instance-absent"}  # fmt: skip
    # n3 dies holding p/1; its binding goes; p/2 is bound and acked on n1; n3 comes back and
    # delivers p/1 after it.
    _write(
        tmp_path / "n3-100-0.jsonl",
        {"ts_ns": 1000, "node": "n3", "kind": "sent", **one},
        {"ts_ns": 1100, "node": "n3", "kind": "delivered", "consumer": "c3", **one},
    )
    _write(
        tmp_path / "n1-50-0.jsonl",
        removal,
        {"ts_ns": 2100, "node": "n1", "kind": "sent", **two},
        {"ts_ns": 2200, "node": "n1", "kind": "delivered", "consumer": "c1", **two},
        {"ts_ns": 2300, "node": "n1", "kind": "acked", "consumer": "c1", **two},
    )
    _write(
        tmp_path / "n3-3000-0.jsonl",
        {"ts_ns": 3500, "node": "n3", "kind": "delivered", "consumer": "c9", **one},
        {"ts_ns": 3600, "node": "n3", "kind": "acked", "consumer": "c9", **one},
    )
    result = job.run(spark, tmp_path)
    assert result.counts == {**NONE, "order": 1}
    assert pure.check(tmp_path) == result.counts
    page = render(result.summary())
    details = page[page.index("Order violations") : page.index("Exclusivity violations")]
    assert "instance-absent" in details and "q@n3" in details  # the removal that explains it
    timeline = page[page.index("What happened, in order") :]
    assert "n1 removed 1 binding(s) to q@n3 (instance-absent)" in timeline
    assert "VIOLATION (order): group g on q, message p/2" in timeline
    # The returning node moved p/1 to the group's new binding instead: accepted, not flagged.
    _write(
        tmp_path / "n3-3000-0.jsonl",
        {"ts_ns": 3400, "node": "n3", "kind": "moved", "target": "q@n1", "delivery_count": 1,
         **one},
    )  # fmt: skip
    _write(
        tmp_path / "n1-3300-0.jsonl",
        {"ts_ns": 3450, "node": "n1", "kind": "sent", **one},
        {"ts_ns": 3500, "node": "n1", "kind": "delivered", "consumer": "c1", **one},
        {"ts_ns": 3600, "node": "n1", "kind": "acked", "consumer": "c1", **one},
    )
    result = job.run(spark, tmp_path)
    assert result.counts == NONE
    assert pure.check(tmp_path) == NONE
    assert result.stats["moved"] == {
        "messages": 1, "groups": 1, "delivered_before": 1, "order_changes_accepted": 1
    }  # fmt: skip
    assert "n3 moved 1 message(s) of 1 group(s) to q@n1" in render(result.summary())


# ---- bad input ------------------------------------------------------------------------------


def test_missing_and_empty_directories_are_one_line_errors(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_check(tmp_path / "nope", spark=spark) == 2
    assert (
        capsys.readouterr().err
        == f"pinmq: error: history directory {tmp_path / 'nope'} does not exist\n"
    )
    assert run_check(tmp_path, spark=spark) == 2
    assert (
        capsys.readouterr().err == f"pinmq: error: no audit segments (*.jsonl) under {tmp_path}\n"
    )
    (tmp_path / "n1-1-0.jsonl").write_text("")
    assert run_check(tmp_path, spark=spark) == 2
    assert "are empty" in capsys.readouterr().err
    (tmp_path / "n1-1-0.jsonl").write_text('garbage\n{"ts_ns": 1}\n[1, 2]\n')
    assert run_check(tmp_path, spark=spark) == 2
    err = capsys.readouterr().err
    assert err.startswith("pinmq: error: no valid audit events in 1 segment(s)")
    assert err.count("\n") == 1 and "Traceback" not in err
    with pytest.raises(HistoryError, match="is not a directory"):
        load(spark, tmp_path / "n1-1-0.jsonl")


def test_malformed_lines_a_torn_tail_and_unknown_fields_are_reported_not_fatal(
    spark: Any, tmp_path: Path
) -> None:
    generate(tmp_path, messages=1000, groups=10, inject=Inject(duplicates=1))
    node_file = next(tmp_path.glob("n1-*.jsonl"))
    lines = node_file.read_text().splitlines(keepends=True)
    lines.insert(5, "this is not json\n")
    lines.insert(9, '{"ts_ns": 5, "kind": "sent"}\n')  # no node
    lines[20] = lines[20].replace('"n":', '"shard":7,"n":')  # a field from a newer writer
    node_file.write_text("".join(lines) + '{"ts_ns":1700000009000000000,"node":"n1","ki')
    out = io.StringIO()
    assert run_check(tmp_path, spark=spark, out=out) == 1  # the duplicate is still found
    text = out.getvalue()
    assert "warning: 2 malformed line(s) skipped, e.g. " in text
    assert "this is not json" in text
    assert "warning: 1 torn last line(s) skipped" in text
    assert f"warning: unknown field(s) ignored: shard (1, in {node_file.name})" in text
    assert "FAIL duplicate deliveries: 1" in text and "verdict: VIOLATIONS (1)" in text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["input"]["malformed_lines"] == 2 and summary["input"]["torn_last_lines"] == 1
    assert summary["input"]["unknown_fields"] == {"shard": 1}
    assert summary["input"]["unknown_field_files"] == {"shard": [node_file.name]}
    assert summary["violations"] == {**NONE, "duplicates": 1}


def _edit(path: Path, index: int, old: str, new: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    assert old in lines[index]
    lines[index] = lines[index].replace(old, new, 1)
    path.write_text("".join(lines))


def test_unknown_fields_are_found_in_every_line_not_a_sample(spark: Any, tmp_path: Path) -> None:
    generate(tmp_path, messages=6000, groups=60)
    n1, n2 = next(tmp_path.glob("n1-*.jsonl")), next(tmp_path.glob("n2-*.jsonl"))
    client = next(tmp_path.glob("client-cn3-*.jsonl"))
    assert len(n1.read_text().splitlines()) == 8000
    _edit(n1, 6000, '"n":', '"shard":7,"n":')  # past the first 5000 lines, before the tail
    _edit(client, 1500, '"n":', '"zone":"eu","n":')
    _edit(client, 1501, '"n":', '"zone":null,"n":')
    # Lines that are longer than their fields need, without an unknown key: a space, an escape.
    _edit(n2, 100, '"kind":', '"kind" : ')
    _edit(n2, 200, '"queue":"orders"', '"queue":"\\u006frders"')
    result = job.run(spark, tmp_path, with_stats=False)
    h = result.history
    assert h.unknown_keys == {"shard": 1, "zone": 2}
    assert h.unknown_key_files == {"shard": [n1.name], "zone": [client.name]}
    assert h.rechecked == 3  # only the files whose size is not what their events take
    assert (
        f"unknown field(s) ignored: shard (1, in {n1.name}), zone (2, in {client.name})"
        in h.warnings()
    )
    assert h.malformed == 0 and result.counts == NONE


def test_an_events_width_is_its_compact_json_length_for_every_number_of_digits(spark: Any) -> None:
    """The unknown-key screen trusts `width()` to the byte: a file adds up only if it does."""
    from pyspark.sql import functions as F

    from pipeline.history import schema, width

    numbers = [0, 7, 10, 99, 100, 12345, 10**9 - 1, 10**9, 10**17, 10**18 - 1, 10**18, 2**63 - 1]
    numbers += [-1, -10, -(2**63)]
    lines = [
        json.dumps(
            {"ts_ns": x, "node": "n\u00e9", "kind": "acked", "group_seq": abs(x) % 1000,
             "new_proposal": x % 2 == 0},
            separators=(",", ":"),
            ensure_ascii=False,
        )
        for x in numbers
    ]  # fmt: skip
    frame = spark.createDataFrame([(line,) for line in lines], "value string")
    parsed = frame.select("value", F.from_json("value", schema()).alias("e")).select("value", "e.*")
    widths = parsed.select(F.octet_length("value").alias("bytes"), width().alias("width"))
    assert [(r["bytes"], r["width"]) for r in widths.collect()] == [
        (len(line.encode()),) * 2 for line in lines
    ]


def test_the_cli_prints_a_verdict_writes_a_report_and_exits_1_on_violations(
    tmp_path: Path,
) -> None:
    history, report = tmp_path / "h", tmp_path / "report"
    generate(history, messages=2000, groups=20, failover=True, inject=Inject(exclusivity=2))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pinmq.cli",
            "check",
            str(history),
            "--master",
            "local[1]",
            "--report",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    assert "FAIL exclusivity violations: 2" in proc.stdout
    assert "verdict: VIOLATIONS (2)" in proc.stdout
    assert "Traceback" not in proc.stderr
    summary = json.loads((report / "summary.json").read_text())
    assert summary["verdict"] == "violations" and summary["violations"]["exclusivity"] == 2
    page = (report / "report.html").read_text()
    for title in (
        "Groups per consumer",
        "Messages per node over time",
        "Decision latency histogram",
        "Exclusivity violations (a second consumer holding a group",
        "<details><summary><code>queue=orders",
        "What happened, in order",
        "Group stalls",
    ):
        assert title in page
    # The timeline names the failover at a readable UTC time, with the groups it stalled.
    when = r"<li><code>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}</code> "
    assert re.search(when + r"node n3 stopped; [1-9]\d* group\(s\) stalled across it</li>", page)
    assert page.count("<svg") >= 4 and "<script" not in page and "http" not in page


def test_the_report_of_a_clean_history(spark: Any, tmp_path: Path) -> None:
    history, report = tmp_path / "h", tmp_path / "r"
    generate(history, messages=1500, groups=15)
    out = io.StringIO()
    assert run_check(history, spark=spark, report=report, out=out) == 0
    assert "verdict: CLEAN" in out.getvalue()
    assert "CLEAN: no loss" in (report / "report.html").read_text()
    assert json.loads((report / "summary.json").read_text())["verdict"] == "clean"
