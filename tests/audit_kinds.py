"""An audit history with every event kind, each carrying every field the schema lets it carry.

Written by the real writers: node kinds from a real core's Effects and `AuditLog`'s own
methods, client kinds by an auditing client against a real node. tests/core/test_audit.py
checks it against the schema (`broker/audit_schema.py`), tests/pipeline/test_pipeline.py
through the checker's reader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import unique

from broker.audit import AuditLog, read_events, segments
from broker.audit_schema import CLIENT_KINDS, FIELDS, MID_HEADER, SEGMENT_RE, Kind
from broker.client import Client
from broker.config import QueueConfig
from broker.config_file import parse_config
from broker.core import BrokerCore
from broker.effects import Effects
from broker.message import GROUP_ID_HEADER, GROUP_SEQ_HEADER, Outgoing
from handler.api import Binding, RemovalReason

# (kind, field) for every field each kind may carry: what the history below holds, exactly.
DECLARED = frozenset((kind, f.name) for f in FIELDS for kind in f.kinds)


def _grouped(group: str, seq: int) -> dict[str, str]:
    return {GROUP_ID_HEADER: group, GROUP_SEQ_HEADER: str(seq), MID_HEADER: f"node.p1/{seq}"}


def write_node_kinds(directory: Path) -> None:
    """sent, delivered, acked, released, rejected (a real core's Effects), moved, routed,
    unbound, denied (as `cluster/claims.py`, `cluster/sending.py`, `pinmq/node.py` and the
    authenticator write them)."""
    core = BrokerCore(parse_config("node: {id: n1}", "x"))
    core.create_queue("q", "q", QueueConfig(max_delivery_attempts=2))
    core.create_queue("held", "held", QueueConfig())
    with AuditLog(directory, "n1", flush_ms=10) as log:
        fx = Effects()
        for seq in (1, 2):
            fx.merge(core.send(Outgoing("q", b"x", _grouped("g", seq), True), 1)[1])
        fx.merge(core.subscribe("q", "c1", "worker", 10, 2))
        log.effects(fx)
        log.effects(core.ack("q", "c1", [1], 3))
        log.effects(core.release("q", "c1", [2], 4))  # redelivered at once
        log.effects(core.reject("q", "c1", [3], 5))  # its redelivery: dead-lettered
        log.effects(core.send(Outgoing("held", b"x", _grouped("h", 3), True), 6)[1])
        core.hold_group("held", "h")
        taken, fx = core.take_group("held", "h")
        log.moved(taken, "held@n2")
        log.effects(fx)
        binding = Binding("g", "q", "n2", 3)
        log.routed(7, "q", _grouped("g", 4), "q", "n2", binding, decision_ns=1500)
        log.record(
            Kind.UNBOUND,
            epoch=binding.epoch,
            group=binding.group,
            queue=binding.queue,
            target=f"{binding.queue}@{binding.node}",
            reason=str(RemovalReason.REAPED),
        )
        log.record(Kind.DENIED, user="bob", peer="127.0.0.1:5000", permission="send", address="q")


async def write_client_kinds(directory: Path, url: str) -> None:
    """client_sent, client_received (twice: a redelivery), client_acked, by a real client."""
    queue = unique("kinds")
    # A node without security ignores the credentials; the client's events name its user.
    async with Client(
        url, audit=directory, audit_name="kinds", user="kinds", password="unchecked"
    ) as client:
        await client.producer(queue, group_id="g").send("one")
        async with client.consumer(queue, name="worker") as consumer:
            first = await consumer.receive(5)
            assert first is not None
            await first.release(wait=True)
            again = await consumer.receive(5)
            assert again is not None and again.delivery_count == 2
            await again.ack(wait=True)


async def write_every_kind(directory: Path, url: str) -> None:
    write_node_kinds(directory)
    await write_client_kinds(directory, url)


def read_back_differences(rows: list[Any], directory: Path) -> list[str]:
    """How the checker's event rows (`pipeline.history.load`) differ from the events written
    under `directory`: each field's value and Python type, matched by writer run and `n`."""
    written = {
        (int(SEGMENT_RE.match(path.name)["boot"]), e["n"]): e  # type: ignore[index]
        for path in segments(directory)
        for e in read_events(path)
    }
    out = [] if len(rows) == len(written) else [f"{len(rows)} rows for {len(written)} events"]
    for row in rows:
        event = written[row["boot"], row["n"]]
        source = "client" if event["kind"] in CLIENT_KINDS else "node"
        read = {f.name: row[f.name] for f in FIELDS if f.name != "mid"}
        if "mid" in event:
            read["mid"] = row["key"]  # the reader's `key` replaces `mid`
        for f in FIELDS:
            value = read.get(f.name)
            if value != event.get(f.name) or type(value) not in (f.type, type(None)):
                out.append(f"{event['kind']} {f.name}: wrote {event.get(f.name)!r}, read {value!r}")
        if row["source"] != source:
            out.append(f"{event['kind']}: read as a {row['source']} event")
    return out


def events_in(directory: Path) -> list[dict[str, Any]]:
    """Every event the audit segments in `directory` hold, file by file."""
    return [e for path in segments(directory) for e in read_events(path)]
