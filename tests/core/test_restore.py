"""A node's stored messages come back after a restart, whichever way its store reads them.

SQLite reads them by its index: grouped messages stay paged (on disk only) until they can be
delivered, so a big store opens, and an ha backup takes over, without reading a body. The
journal reads them whole. Either way every message comes back once, each group in the order
it was sent, with its delivery count. A real engine on a real data directory.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from broker.clock import now_ns
from broker.config import NodeConfig, QueueConfig
from broker.effects import Delivery
from broker.engine import Engine
from broker.kept_index import KeptIndex
from broker.message import GROUP_ID_HEADER, Outgoing
from broker.sending import LocalSendPath
from broker.streams import ConsumerStream

GROUPS, PER_GROUP, UNGROUPED = 4, 50, 10


def _messages() -> list[Outgoing]:
    grouped = [
        Outgoing("q", f"g{g}-{i}".encode(), {GROUP_ID_HEADER: f"g{g}"}, True)
        for i in range(PER_GROUP)
        for g in range(GROUPS)
    ]
    return grouped + [Outgoing("q", f"u-{i}".encode(), {}, True) for i in range(UNGROUPED)]


async def _store(engine: Engine, sent: list[Outgoing]) -> None:
    """Queue q, and `sent` routed to it, stored."""
    await engine.create_queue("q", "q", QueueConfig())
    with engine.unit() as unit:
        LocalSendPath().send_now(sent, unit, now_ns())
    assert unit.write is not None
    await unit.write


async def _receive(stream: ConsumerStream, n: int) -> list[Delivery]:
    out: list[Delivery] = []
    while len(out) < n:
        out += await asyncio.wait_for(stream.outbound.get(), 10)
    return out


async def _settle(engine: Engine, stream: ConsumerStream, kind: str, ids: list[int]) -> None:
    with engine.unit() as unit:
        unit.settle(stream, kind, ids)  # type: ignore[arg-type]
    if unit.write is not None:
        await unit.write


@pytest.mark.parametrize("store_format", ["sqlite", "journal"])
async def test_a_restart_brings_back_every_message_once_in_group_order_with_its_count(
    tmp_path: Path, store_format: str
) -> None:
    config = NodeConfig.model_validate(
        {"node": {"id": "n1", "data-dir": str(tmp_path)}, "store": {"format": store_format}}
    )
    sent = _messages()
    engine = Engine(config)
    engine.open()
    engine.start()
    try:
        await _store(engine, sent)
        with engine.unit() as unit:
            stream = unit.subscribe("q", "c1", "before", 3)
        acked, released, out = await _receive(stream, 3)
        await _settle(engine, stream, "ack", [acked.delivery_id])
        await _settle(engine, stream, "release", [released.delivery_id])
        await asyncio.sleep(0.05)
        delivered = {released.message.body, out.message.body}  # each comes back counted
        while not stream.outbound.empty():
            delivered |= {d.message.body for d in stream.outbound.get_nowait()}
    finally:
        await engine.close()

    engine = Engine(config)
    expected = [m.body for m in sent if m.body != acked.message.body]
    paged = sum(GROUP_ID_HEADER in m.headers for m in sent if m.body != acked.message.body)
    assert engine.open() == (len(expected), 0)
    engine.start()
    try:
        counts = engine.queue("q").counts()
        assert counts.pending == len(expected)
        assert counts.paged == (paged if store_format == "sqlite" else 0)
        with engine.unit() as unit:
            stream = unit.subscribe("q", "c2", "after", 1000)
        got = await _receive(stream, len(expected))
        await asyncio.sleep(0.05)
        assert stream.outbound.empty()  # nothing twice
        assert sorted(d.message.body for d in got) == sorted(expected)
        for g in [*(f"g{g}" for g in range(GROUPS)), "u"]:
            mine = [d.message.body for d in got if d.message.body.startswith(f"{g}-".encode())]
            assert mine == [b for b in expected if b.startswith(f"{g}-".encode())], g
        counted = {d.message.body for d in got if d.message.delivery_count}
        assert counted == delivered - {acked.message.body}
        assert engine.queue("q").counts().paged == 0
    finally:
        await engine.close()


async def test_a_kept_index_is_used_where_it_matches_the_store_and_else_the_store_is_scanned(
    tmp_path: Path,
) -> None:
    """An ha backup hands the index it kept while following to its start (`Engine.open`); one
    that does not hold what the store holds is not trusted: the store is scanned, with a
    warning."""
    config = NodeConfig.model_validate(
        {"node": {"id": "n1", "data-dir": str(tmp_path)}, "store": {"format": "sqlite"}}
    )
    sent = _messages()
    engine = Engine(config)
    engine.open()
    try:
        await _store(engine, sent)
    finally:
        await engine.close()
    with sqlite3.connect(tmp_path / "store.db") as conn:
        cursor = conn.execute("SELECT * FROM messages")
        columns, table = [c[0] for c in cursor.description], cursor.fetchall()

    for rows, way in ((table, "kept index"), (table[1:], "store index")):
        kept = KeptIndex()
        kept.add_rows(columns, rows)
        engine = Engine(config)
        with capture_logs() as logged:
            assert engine.open(kept) == (len(sent), 0)
        engine.start()
        try:
            assert engine.restored_from == way
            warned = [e for e in logged if e["log_level"] == "warning"]
            assert len(warned) == (way == "store index"), logged
            with engine.unit() as unit:
                stream = unit.subscribe("q", "c", "after", 1000)
            got = [d.message.body for d in await _receive(stream, len(sent))]
            assert sorted(got) == sorted(m.body for m in sent)
            for g in range(GROUPS):
                mine = [b for b in got if b.startswith(f"g{g}-".encode())]
                assert mine == [f"g{g}-{i}".encode() for i in range(PER_GROUP)]
        finally:
            await engine.close()
