"""Unit tests of the STOMP session over the real core, with the node's I/O replaced by a stub."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker.config import NodeConfig
from broker.config_file import parse_config
from broker.core import BrokerCore
from broker.effects import Effects
from broker.engine import Engine
from broker.sending import LocalSendPath
from broker.streams import Outlets, ReceiptFor
from broker.unit import Unit
from pinmq.stomp.frames import Frame, FrameParser, encode_frame
from pinmq.stomp.protocol import (
    CLOSE,
    ProtocolError,
    negotiate_heart_beat,
    negotiate_version,
    prefetch_of,
    queue_name,
)
from pinmq.stomp.session import Session


class StubNode:
    """The engine as a session uses it, over a real core and real units; a commit pushes
    deliveries at once, and a write with persistent messages is `gate` (None: done)."""

    def __init__(self) -> None:
        self.config = NodeConfig.model_validate({"node": {"id": "unit"}})
        self.core = self._core = BrokerCore(self.config)  # `_core`: what `creates` reads
        self.outlets = Outlets(lambda: True)
        self.gate: asyncio.Future[None] | None = None
        self.sending = LocalSendPath()
        self.memory = self.core.budget.node

    def unit(self) -> Unit:
        return Unit(self.core, self.outlets, self._apply, lambda queue: None, None)

    def _apply(
        self, fx: Effects, receipts: list[ReceiptFor], marks: object
    ) -> asyncio.Future[None] | None:
        self.outlets.push(fx.deliveries, receipts, [])
        return self.gate if any(m.persistent for m in fx.added) else None

    creates = Engine.creates  # the engine's own rule, over this stub's core and config

    def admit(self, addresses: Any) -> None:
        """Room for every send: the budget is the engine's (tests/node/test_address_full.py)."""

    async def create_queue(
        self, address: str, name: str, settings: Any, auto_created: bool = False
    ) -> None:
        self.core.create_queue(address, name, settings, auto_created)


def drain(out: asyncio.Queue[Any]) -> list[Any]:
    items = []
    while not out.empty():
        items.append(out.get_nowait())
    return items


def frames_of(session: Session, items: list[Any]) -> list[Frame]:
    """Control frames and rendered MESSAGE frames, parsed back."""
    parts: list[bytes] = []
    for item in items:
        if isinstance(item, bytes):
            parts.append(item)
        elif isinstance(item, list):
            session.render(item, parts, None)
    parser = FrameParser(escaping=True)
    parser.feed(b"".join(parts))
    got = []
    while (f := parser.next()) is not None:
        got.append(f)
    return got


@pytest.fixture
def stub() -> StubNode:
    return StubNode()


async def new_session(stub: StubNode) -> tuple[Session, asyncio.Queue[Any]]:
    out: asyncio.Queue[Any] = asyncio.Queue()
    session = Session(stub, stub.sending, "stomp-1", out, "test")  # type: ignore[arg-type]
    await session.receive(encode_frame("CONNECT", {"accept-version": "1.2", "host": "h"}))
    [connected] = frames_of(session, drain(out))
    assert connected.command == "CONNECTED"
    return session, out


# ---- pure helpers ----------------------------------------------------------------------------


def test_negotiate_version() -> None:
    assert negotiate_version(None) == "1.0"
    assert negotiate_version("1.0,1.1,1.2") == "1.2"
    assert negotiate_version("1.1, 1.0") == "1.1"
    assert negotiate_version("2.0") is None


def test_negotiate_heart_beat() -> None:
    assert negotiate_heart_beat(None, 1000) == (0, 0)
    assert negotiate_heart_beat("0,0", 1000) == (0, 0)
    assert negotiate_heart_beat("500,2000", 1000) == (2000, 1000)
    assert negotiate_heart_beat("5000,0", 1000) == (0, 5000)
    assert negotiate_heart_beat("100,100", 0) == (0, 0)
    for bad in ("x", "1", "-1,5", "a,b"):
        with pytest.raises(ProtocolError, match="invalid heart-beat"):
            negotiate_heart_beat(bad, 1000)


def test_queue_name() -> None:
    assert queue_name("/queue/orders") == "orders"
    assert queue_name("orders.eu") == "orders.eu"
    assert queue_name("/queue/a/b") == "a/b"
    for bad in ("/topic/x", "/queue/", "", "/x"):
        with pytest.raises(ProtocolError, match="unsupported destination"):
            queue_name(bad)


def test_prefetch_of() -> None:
    assert prefetch_of({}, 1000) == 1000
    assert prefetch_of({"activemq.prefetchSize": "7", "prefetch-count": "9"}, 1000) == 7
    assert prefetch_of({"prefetch-count": "9"}, 1000) == 9
    with pytest.raises(ProtocolError):
        prefetch_of({"prefetch-count": "-3"}, 1000)


def test_stomp_config_section() -> None:
    cfg = parse_config("node: {id: n}\nstomp: {max-frame-size: 2048, heart-beat-ms: 0}\n", "t")
    assert (cfg.stomp.max_frame_size, cfg.stomp.heart_beat_ms) == (2048, 0)
    assert (cfg.stomp.max_headers, cfg.stomp.default_prefetch) == (1000, 1000)


# ---- the session ---------------------------------------------------------------------------------


async def test_frames_pipelined_after_connect_are_unescaped(stub: StubNode) -> None:
    out: asyncio.Queue[Any] = asyncio.Queue()
    session = Session(stub, stub.sending, "stomp-1", out, "test")  # type: ignore[arg-type]
    data = encode_frame("CONNECT", {"accept-version": "1.2"}) + encode_frame(
        "SEND", {"destination": "q", "k\nx": "a:b"}, b"body"
    )
    await session.receive(data)
    [m] = stub.core.queue("q").held()
    assert m.headers == {"k\nx": "a:b"}


async def test_receipts_wait_for_their_store_write_and_keep_their_order(stub: StubNode) -> None:
    session, out = await new_session(stub)
    write = stub.gate = asyncio.get_running_loop().create_future()
    await session.receive(
        encode_frame("SEND", {"destination": "q", "persistent": "true", "receipt": "r1"}, b"x")
    )
    stub.gate = None
    await session.receive(encode_frame("BEGIN", {"transaction": "t", "receipt": "r2"}))
    assert drain(out) == []  # r2 waits behind r1, whose write is not on disk yet
    write.set_result(None)
    await asyncio.sleep(0)
    assert [f.headers["receipt-id"] for f in frames_of(session, drain(out))] == ["r1", "r2"]


async def test_failed_store_write_becomes_an_error(stub: StubNode) -> None:
    session, out = await new_session(stub)
    stub.gate = asyncio.get_running_loop().create_future()
    await session.receive(
        encode_frame("SEND", {"destination": "q", "persistent": "true", "receipt": "r"}, b"x")
    )
    stub.gate.set_exception(OSError("disk full"))
    await asyncio.sleep(0)
    items = drain(out)
    assert items[-1] is CLOSE
    [error] = frames_of(session, items[:-1])
    assert "store write failed: disk full" in error.headers["message"]


async def test_cumulative_ack_takes_every_earlier_delivery(stub: StubNode) -> None:
    session, out = await new_session(stub)
    for i in range(4):
        await session.receive(encode_frame("SEND", {"destination": "q"}, b"%d" % i))
    await session.receive(
        encode_frame("SUBSCRIBE", {"destination": "q", "id": "s", "ack": "client"})
    )
    messages = frames_of(session, drain(out))
    assert len(messages) == 4
    await session.receive(encode_frame("ACK", {"id": messages[2].headers["ack"]}))
    assert stub.core.queue("q").depth == 1
    [sub] = session.subs.values()
    assert [d for d, _ in sub.outstanding] == [int(messages[3].headers["ack"].split("/")[1])]


async def test_unsubscribe_drops_deliveries_still_queued(stub: StubNode) -> None:
    session, out = await new_session(stub)
    await session.receive(encode_frame("SEND", {"destination": "q"}, b"x"))
    await session.receive(encode_frame("SUBSCRIBE", {"destination": "q", "id": "s"}))
    await session.receive(encode_frame("UNSUBSCRIBE", {"id": "s"}))
    assert frames_of(session, drain(out)) == []  # the core took the message back
    assert stub.core.queue("q").depth == 1
    assert "stomp-1-1" not in stub.outlets


async def test_close_discards_transactions_and_closes_consumers(stub: StubNode) -> None:
    session, _ = await new_session(stub)
    await session.receive(encode_frame("SEND", {"destination": "q"}, b"x"))
    await session.receive(encode_frame("SUBSCRIBE", {"destination": "q", "id": "s"}))
    await session.receive(encode_frame("BEGIN", {"transaction": "t"}))
    await session.receive(encode_frame("SEND", {"destination": "q", "transaction": "t"}, b"y"))
    session.close()
    q = stub.core.queue("q")
    assert (q.depth, q.consumer_count) == (1, 0)
    assert len(session.txs) == 0
