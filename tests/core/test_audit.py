"""The audit log: the writer, a real node with `audit` on, the client and CLI side, crashes."""

from __future__ import annotations

import asyncio
import errno
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from audit_kinds import DECLARED, events_in, write_every_kind
from conftest import REPO, NodeProcess, cli, depth, unique
from engine_harness import RecordingEngine, send
from send_harness import ME, Node, ScriptedHandler, bind, msg, peers
from structlog.testing import capture_logs
from waiting import until, wait

from broker import audit as audit_module
from broker.audit import MID_HEADER, AuditLog, node_audit, read_events, segments
from broker.audit_schema import FIELDS, Kind
from broker.client import Client
from broker.config import NodeConfig, QueueConfig
from broker.config_file import ConfigError, parse_config
from broker.core import BrokerCore
from broker.effects import Effects
from broker.message import Outgoing
from cluster.member import ClusterMember
from cluster.sending import ClusteredSendPath
from handler.api import Binding
from pipeline import history

AUDIT = {"audit": {"enabled": True, "flush-ms": 20}}


def wait_for(directory: Path, check: Any, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The events written in `directory` once `check(events)` holds."""

    def events() -> list[dict[str, Any]] | None:
        found = events_in(directory) if directory.exists() else []
        return found if check(found) else None

    return wait(f"the audit events expected in {directory}", events, timeout)


# ---- config ---------------------------------------------------------------------------------


def test_the_audit_section_defaults_off_and_takes_sizes_with_units() -> None:
    config = parse_config("node: {id: a}", "x.yaml")
    assert not config.audit.enabled and config.audit.dir is None
    assert config.audit.segment_bytes == 64 * 1024 * 1024
    config = parse_config("node: {id: a}\naudit: {enabled: true, segment-bytes: 2KiB}", "x")
    assert config.audit.segment_bytes == 2048
    with pytest.raises(ConfigError, match=r"audit\.segment-bytes: got '2 parsecs'"):
        parse_config("node: {id: a}\naudit: {segment-bytes: 2 parsecs}", "x")


# ---- the schema ---------------------------------------------------------------------------


async def test_every_kind_is_written_with_the_fields_and_types_the_schema_declares(
    url: str, tmp_path: Path
) -> None:
    await write_every_kind(tmp_path, url)
    fields = {f.name: f for f in FIELDS}
    written = set()
    for event in events_in(tmp_path):
        kind = Kind(event["kind"])
        assert {f.name for f in FIELDS if f.required} <= event.keys()
        for key, value in event.items():
            assert kind in fields[key].kinds and type(value) is fields[key].type, (kind, key)
            written.add((kind, key))
    assert written == DECLARED  # every kind, with every field it may carry


def test_the_checker_reads_every_field_of_the_schema_with_its_type() -> None:
    from pyspark.sql import types as T

    spark = {int: T.LongType(), str: T.StringType(), bool: T.BooleanType()}
    expected = [(f.name, spark[f.type]) for f in FIELDS]
    assert [(c.name, c.dataType) for c in history.schema()] == expected
    assert {f.name for f in FIELDS} == history.KNOWN_KEYS
    assert history.REQUIRED == ("ts_ns", "node", "kind")  # what a line must have, as ever


def test_the_field_table_in_the_docs_is_the_schema() -> None:
    doc = (REPO / "docs" / "pipeline.md").read_text()
    table = re.findall(r"^\| `(\w+)` \| (\w+) \|", doc, re.MULTILINE)
    assert sorted(table) == sorted((f.name, f.type.__name__) for f in FIELDS)


def test_record_takes_only_the_schema_s_kinds_and_fields(tmp_path: Path) -> None:
    log = AuditLog(tmp_path, "c")
    with pytest.raises(ValueError, match=r"not in the audit schema: 'client_snt'"):
        log.record("client_snt", msg_id=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\['consumer_label'\]"):
        log.record(Kind.CLIENT_ACKED, msg_id=1, consumer_label="w")


# ---- the writer ---------------------------------------------------------------------------


def test_node_events_from_a_real_core(tmp_path: Path) -> None:
    core = BrokerCore(parse_config("node: {id: n1}", "x"))
    core.create_queue("q", "q", QueueConfig(max_delivery_attempts=2))
    log = AuditLog(tmp_path, "n1", flush_ms=10).start()
    fx = Effects()
    for seq in (1, 2, 3):
        headers = {"JMSXGroupID": "g", "JMSXGroupSeq": str(seq), MID_HEADER: f"p.1/{seq}"}
        fx.merge(core.send(Outgoing("q", b"x", headers, True), 1)[1])
    fx.merge(core.subscribe("q", "c1", "worker", 10, 2))
    log.effects(fx)
    log.effects(core.ack("q", "c1", [1], 3))
    log.effects(core.release("q", "c1", [2], 4))  # takes back 3 as well; both redelivered
    log.effects(core.reject("q", "c1", [4], 5))  # the redelivery of 2: dead-lettered
    log.effects(core.close_consumer("q", "c1", 6))  # returns 3: its 2nd attempt, so dead
    log.close()
    events = events_in(tmp_path)
    kinds = [(e["kind"], e.get("mid")) for e in events if e.get("queue") == "q"]
    assert kinds == [
        *[("sent", f"p.1/{i}") for i in (1, 2, 3)],
        *[("delivered", f"p.1/{i}") for i in (1, 2, 3)],
        ("acked", "p.1/1"),
        ("released", "p.1/2"),
        ("released", "p.1/3"),
        ("delivered", "p.1/2"),
        ("delivered", "p.1/3"),
        ("rejected", "p.1/2"),
        ("rejected", "p.1/3"),
    ]
    first = events[3]
    assert first["node"] == "n1" and first["consumer"] == "c1" and first["delivery_count"] == 1
    assert first["group"] == "g" and first["group_seq"] == 1 and first["producer"] == "p.1"
    assert first["address"] == "q" and first["msg_id"] == 1 and isinstance(first["ts_ns"], int)
    redelivered = [e for e in events if e["kind"] == "delivered" and e["mid"] == "p.1/2"][1]
    assert redelivered["delivery_count"] == 2
    assert [e["n"] for e in events] == list(range(1, len(events) + 1))
    assert any(e["kind"] == "sent" and e["queue"] == "DLQ" for e in events)  # dead-lettered copy


def test_a_message_taken_away_unheld_leaves_no_acked_event(tmp_path: Path) -> None:
    core = BrokerCore(parse_config("node: {id: n1}", "x"))
    core.create_queue("q", "q", QueueConfig())
    log = AuditLog(tmp_path, "n1", flush_ms=10).start()
    log.effects(core.send(Outgoing("q", b"x", {MID_HEADER: "p/1"}, True), 1)[1])
    log.effects(core.send(Outgoing("q", b"y", {MID_HEADER: "p/2"}, True), 1)[1])
    log.effects(core.subscribe("q", "c1", "worker", 1, 2))  # holds p/1 only
    taken, fx = core.take_ungrouped("q")  # ON_DEMAND redistribution takes p/2 away
    assert [m.headers[MID_HEADER] for m in taken] == ["p/2"] and fx.removed
    log.effects(fx)
    log.effects(core.ack("q", "c1", [1], 3))
    log.close()
    kinds = [(e["kind"], e["mid"], e.get("consumer")) for e in events_in(tmp_path)]
    assert kinds == [
        ("sent", "p/1", None),
        ("sent", "p/2", None),
        ("delivered", "p/1", "c1"),
        ("acked", "p/1", "c1"),
    ]


def test_routed_events_and_rolling_segments(tmp_path: Path) -> None:
    log = AuditLog(tmp_path, "n2", segment_bytes=2000, flush_ms=10).start()
    for i in range(60):
        log.routed(
            i + 1,
            "orders",
            {MID_HEADER: f"p/{i}"},
            "orders",
            "n1",
            Binding(f"g{i}", "orders", "n1", 3),
            decision_ns=1500 if i % 2 == 0 else None,
        )
    log.routed(None, "orders", {}, "orders", "n3")  # ungrouped: no binding, no proposal
    log.close()
    files = segments(tmp_path)
    assert len(files) > 3 and all(f.stat().st_size <= 2000 for f in files)
    assert [f.name for f in files[:2]] == [f"n2-{log.boot}-0.jsonl", f"n2-{log.boot}-1.jsonl"]
    events = events_in(tmp_path)
    assert len(events) == 61
    assert events[0] == {
        "ts_ns": events[0]["ts_ns"],
        "node": "n2",
        "epoch": 3,
        "kind": "routed",
        "msg_id": 1,
        "mid": "p/0",
        "address": "orders",
        "queue": "orders",
        "group": "g0",
        "target": "orders@n1",
        "new_proposal": True,
        "decision_ns": 1500,
        "n": 1,
    }
    assert events[1]["new_proposal"] is False and "decision_ns" not in events[1]
    assert {k: v for k, v in events[-1].items() if k != "ts_ns"} == {
        "node": "n2",
        "kind": "routed",
        "address": "orders",
        "queue": "orders",
        "target": "orders@n3",
        "n": 61,
    }


def test_the_reader_skips_a_torn_last_line_and_names_a_malformed_one(tmp_path: Path) -> None:
    path = tmp_path / "n1-1-0.jsonl"
    path.write_text('{"ts_ns":1,"node":"n1","kind":"sent"}\n{"ts_ns":2,"node":"n1","ki')
    assert [e["ts_ns"] for e in read_events(path)] == [1]
    path.write_text('{"ts_ns":1,"node":"n1","kind":"sent"}\nnot json\n{"ts_ns":3}\n')
    with pytest.raises(ValueError, match=r"n1-1-0.jsonl:2: malformed audit line"):
        list(read_events(path))


def test_a_full_disk_drops_its_batch_and_writing_goes_on_in_a_new_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills up in the middle of a batch: the line it cut stays the last line of its
    segment (readers skip it), the lost events are counted and logged, and the writer goes on
    in a new segment once space is back; nothing is raised to the caller."""
    real_write = os.write
    disk = {"room": None}  # bytes left on the audit log's disk, None: unlimited

    def write(fd: int, data: Any) -> int:
        room = disk["room"]
        if room is None or not os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path)):
            return real_write(fd, data)  # not the audit log's file: the process writes as usual
        if room == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        disk["room"] = max(0, room - len(data))
        return real_write(fd, bytes(data[:room]))

    monkeypatch.setattr(audit_module.os, "write", write)
    log = AuditLog(tmp_path, "n1", flush_ms=10).start()

    def wait(done: Any) -> None:
        deadline = time.monotonic() + 10
        while not done() and time.monotonic() < deadline:
            time.sleep(0.01)

    with capture_logs() as logged:
        for i in range(3):
            log.record("client_sent", msg_id=i, address="a")
        wait(lambda: log.written == 3)
        disk["room"] = 20
        for i in range(3, 5):
            log.record("client_sent", msg_id=i, address="a")
        wait(lambda: log.dropped == 2)
        assert isinstance(log.error, OSError) and log.written == 3
        disk["room"] = None
        for i in range(5, 7):
            log.record("client_sent", msg_id=i, address="a")
        wait(lambda: log.written == 5)
        assert log.error is None
        disk["room"] = 0  # full again at shutdown: the last event is dropped, close goes on
        log.record("client_sent", msg_id=7, address="a")
        log.close()
    assert log.dropped == 3 and log.written == 5
    first, second = segments(tmp_path)
    assert first.read_bytes().count(b"\n") == 3 and not first.read_bytes().endswith(b"\n")
    assert [e["msg_id"] for e in read_events(first)] == [0, 1, 2]  # the cut line is skipped
    assert [e["msg_id"] for e in read_events(second)] == [5, 6]
    failed = [e for e in logged if e["event"] == "audit write failed"]
    # once per distinct error: when the disk filled, and again at close (after resuming)
    assert [e["log_level"] for e in failed] == ["error", "error"] and failed[1]["dropped"] == 3
    assert "No space left" in failed[0]["error"]
    assert [e["dropped"] for e in logged if e["event"] == "audit writing resumed"] == [2]


# ---- the cluster send path ---------------------------------------------------------------


async def test_the_send_path_writes_one_routed_event_per_message_and_target_queue(
    tmp_path: Path,
) -> None:
    news = {"orders": {"routing-type": "multicast", "queues": {"orders.a": {}, "orders.b": {}}}}
    config = NodeConfig.model_validate(
        {
            "node": {"id": ME, "data-dir": str(tmp_path / ME)},
            "cluster": {"address": "orders"},
            "grouping-handler": {"type": "REMOTE", "address": "orders"},
            "addresses": news,
            "audit": {"enabled": True, "dir": str(tmp_path / "audit")},
        }
    )
    audit = node_audit(config)
    assert audit is not None
    engine, handler = RecordingEngine(config, audit), ScriptedHandler()
    cluster = ClusterMember(engine)
    node = Node(engine, cluster, ClusteredSendPath(engine, cluster, handler))
    audit.start()
    peers(node, {"n2": {"orders": {"orders.a": 1, "orders.b": 1}}})  # only n2 has consumers
    bind(handler, "known", "orders.a", "n2")
    bind(handler, "known", "orders.b", ME)
    batch = [msg("1", "new"), msg("2", "known"), msg("3", "new"), msg("4")]
    ids, fx = await send(engine, node.sender, batch)
    audit.close()
    assert sorted(handler.calls) == [("new", "orders.a", "n2"), ("new", "orders.b", "n2")]
    routed = events_in(tmp_path / "audit")
    assert [e["msg_id"] for e in routed] == [m.msg_id for m in fx.added]
    assert ids == [m.msg_id for m in fx.added[::2]]
    # Each queue of the address is routed on its own; a decision awaited for the batch counts
    # as a new proposal for the first message it routes, not for the group's later ones.
    assert [
        (e["target"], e.get("group"), e.get("epoch"), e.get("new_proposal"), "decision_ns" in e)
        for e in routed
    ] == [
        ("orders.a@n2", "new", 1, True, True),
        ("orders.b@n2", "new", 1, True, True),
        ("orders.a@n2", "known", 1, False, False),
        (f"orders.b@{ME}", "known", 1, False, False),
        ("orders.a@n2", "new", 1, False, False),
        ("orders.b@n2", "new", 1, False, False),
        ("orders.a@n2", None, None, None, False),
        ("orders.b@n2", None, None, None, False),
    ]
    assert {(e["kind"], e["address"], e["node"]) for e in routed} == {("routed", "orders", ME)}
    assert [e["queue"] for e in routed] == ["orders.a", "orders.b"] * 4
    assert all(e["decision_ns"] > 0 for e in routed if "decision_ns" in e)


# ---- a real node and the client --------------------------------------------------------------


async def test_a_node_and_an_auditing_client_leave_both_sides_of_the_story(
    node_factory: Any, tmp_path: Path
) -> None:
    node: NodeProcess = node_factory(AUDIT)
    node_id = f"test-{node.port}"
    queue, client_dir = unique("orders"), tmp_path / "clients"
    async with Client(node.url, audit=client_dir, audit_name="drill") as client:
        producer = client.producer(queue, group_id="g1")
        await producer.send("one")
        await producer.send_batch(["two", "three"])
        await producer.send_many(["four", "five"], batch_size=1)
        async with client.consumer(queue, name="worker", prefetch=10) as consumer:
            got = [await consumer.receive(5) for _ in range(5)]
            await got[0].ack()
            await got[1].release()  # takes back 2..5 from this consumer
            again = [await consumer.receive(5) for _ in range(4)]
            await consumer.ack_many(again, wait=True)
            consumer_id = consumer.consumer_id
    assert [m.text for m in again] == ["two", "three", "four", "five"]
    mids = [f"drill.p1/{i}" for i in range(1, 6)]

    mine = events_in(client_dir)
    sent = [e for e in mine if e["kind"] == "client_sent"]
    assert [e["mid"] for e in sent] == mids
    assert {e["producer"] for e in sent} == {"drill.p1"} and sent[0]["node"] == node.url
    assert [e["group_seq"] for e in sent] == [1, 2, 3, 4, 5] and sent[0]["msg_id"] > 0
    received = [e for e in mine if e["kind"] == "client_received"]
    assert [e["mid"] for e in received] == mids + mids[1:]
    assert {e["consumer"] for e in received} == {consumer_id}
    assert received[0]["consumer_name"] == "worker" and received[-1]["delivery_count"] == 2
    assert [e["mid"] for e in mine if e["kind"] == "client_acked"] == mids

    audit_dir = node.data_dir / "audit"
    theirs = wait_for(audit_dir, lambda ev: sum(e["kind"] == "acked" for e in ev) == 5)
    ours = [e for e in theirs if e.get("queue") == queue]
    assert all(e["node"] == node_id for e in ours)
    by_kind = {k: [e["mid"] for e in ours if e["kind"] == k] for k in ("sent", "acked")}
    assert by_kind == {"sent": mids, "acked": mids}
    assert [e["mid"] for e in ours if e["kind"] == "released"] == mids[1:]
    delivered = [e for e in ours if e["kind"] == "delivered"]
    assert [e["mid"] for e in delivered] == mids + mids[1:]
    assert {e["consumer"] for e in delivered} == {consumer_id}


def test_the_cli_audits_sends_and_consumes(node_factory: Any, tmp_path: Path) -> None:
    node = node_factory()
    queue, audit = unique("cli"), tmp_path / "drill"
    sent = cli(
        "send",
        queue,
        "--group",
        "g",
        "--count",
        "7",
        "--body",
        "x",
        "--url",
        node.url,
        "--audit",
        str(audit),
    )
    assert sent.returncode == 0, sent.stderr
    got = cli(
        "consume",
        queue,
        "--count",
        "7",
        "--timeout",
        "5",
        "--url",
        node.url,
        "--audit",
        str(audit),
        "--name",
        "cli-worker",
    )
    assert got.returncode == 0, got.stderr
    events = events_in(audit)
    kinds = [e["kind"] for e in events]
    assert kinds.count("client_sent") == 7 and kinds.count("client_received") == 7
    assert kinds.count("client_acked") == 7
    assert len({e["mid"] for e in events}) == 7
    assert {e["consumer_name"] for e in events if "consumer_name" in e} == {"cli-worker"}


@pytest.mark.slow
async def test_kill_9_keeps_every_written_line_and_a_restart_writes_a_new_run(
    node_factory: Any,
) -> None:
    node: NodeProcess = node_factory(AUDIT)
    queue = unique("crash")
    audit_dir = node.data_dir / "audit"
    async with Client(node.url) as client:
        producer = client.producer(queue, group_id="g")
        await producer.send_many([f"m{i}" for i in range(2000)], batch_size=100)
    before = wait_for(audit_dir, lambda ev: sum(e["kind"] == "sent" for e in ev) == 2000)
    assert sum(e["kind"] == "sent" for e in before) == 2000
    [first] = segments(audit_dir)
    written = first.read_bytes()
    # More load, and a kill -9 in the middle of it.
    async with Client(node.url) as client:
        producer = client.producer(queue, group_id="g2")
        sending = asyncio.ensure_future(
            producer.send_many([f"n{i}" for i in range(20000)], batch_size=50)
        )

        async def under_way() -> bool:
            return await depth(client, queue) > 2000

        await until("the second load under way", under_way)
        node.stop(signal.SIGKILL)
        with pytest.raises(Exception):  # noqa: B017 -- the node is gone, whatever the error
            await sending
    after = first.read_bytes()
    assert after.startswith(written)  # nothing written before was touched
    events = list(read_events(first))  # whole lines only (a torn tail would be skipped)
    assert len(events) >= 2000
    assert [e["n"] for e in events] == list(range(1, len(events) + 1))
    node.start()
    async with Client(node.url) as client, client.consumer(queue, prefetch=50) as consumer:
        m = await consumer.receive(5)
        assert m is not None and m.text == "m0"
        await m.ack(wait=True)
    node.stop()
    files = segments(audit_dir)
    assert len(files) == 2 and files[0] == first and files[0].read_bytes() == after
    boots = sorted(int(f.name.split("-")[-2]) for f in files)
    assert boots[0] < boots[1]
    restarted = [e["kind"] for e in read_events(files[1]) if e.get("queue") == queue]
    assert "delivered" in restarted and "acked" in restarted
