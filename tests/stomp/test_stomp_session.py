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

    def __init__(self, settings: dict[str, Any] | None = None) -> None:
        self.config = NodeConfig.model_validate({"node": {"id": "unit"}, **(settings or {})})
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


# ---- runs: consecutive SENDs (or ACKs) of a read applied as one command -----------------------


class CountingSendPath(LocalSendPath):
    """The local send path, recording the size of every batch it routes."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def send_now(self, batch: Any, unit: Unit, now_ns: int) -> list[int]:
        self.batches.append(len(batch))
        return super().send_now(batch, unit, now_ns)


def bodies(stub: StubNode, queue: str) -> list[bytes]:
    return [m.body for m in stub.core.queue(queue).held()]


async def test_a_run_of_sends_is_routed_as_one_batch_before_the_frame_after_it(
    stub: StubNode,
) -> None:
    stub.sending = counting = CountingSendPath()
    session, out = await new_session(stub)
    send = [
        encode_frame("SEND", {"destination": "q", "JMSXGroupID": "g"}, b"%d" % i) for i in range(8)
    ]
    subscribe = encode_frame(
        "SUBSCRIBE", {"destination": "q", "id": "s", "ack": "client-individual"}
    )
    last = encode_frame("SEND", {"destination": "q", "JMSXGroupID": "g", "receipt": "r"}, b"8")
    await session.receive(b"".join([*send[:5], subscribe, *send[5:], last]))
    assert counting.batches == [5, 4]  # the SUBSCRIBE ended the first run, the receipt the second
    got = frames_of(session, drain(out))
    assert [f.body for f in got if f.command == "MESSAGE"] == [b"%d" % i for i in range(9)]
    assert [f.headers["receipt-id"] for f in got if f.command == "RECEIPT"] == ["r"]


async def test_a_refused_send_in_a_run_is_named_and_the_sends_before_it_stay() -> None:
    stub = StubNode({"address-settings": {"noauto.#": {"auto-create-addresses": False}}})
    session, out = await new_session(stub)
    frames = [
        encode_frame("SEND", {"destination": "q"}, b"1"),
        encode_frame("SEND", {"destination": "noauto.z"}, b"2"),
        encode_frame("SEND", {"destination": "q", "receipt": "r"}, b"3"),
    ]
    await session.receive(b"".join(frames))
    assert bodies(stub, "q") == [b"1"]  # nothing after the refused SEND was applied
    items = drain(out)
    assert items[-1] is CLOSE
    [error] = frames_of(session, items[:-1])  # an ERROR, and no RECEIPT
    assert "noauto.z" in error.headers["message"]


async def test_an_invalid_frame_after_a_run_comes_after_the_run(stub: StubNode) -> None:
    session, out = await new_session(stub)
    frames = [
        encode_frame("SEND", {"destination": "q"}, b"1"),
        encode_frame("SEND", {"destination": "q"}, b"2"),
        encode_frame("SEND", {"receipt": "r"}, b"3"),  # no destination
    ]
    await session.receive(b"".join(frames))
    assert bodies(stub, "q") == [b"1", b"2"]
    [error] = frames_of(session, drain(out)[:-1])
    assert (error.command, error.headers["receipt-id"]) == ("ERROR", "r")
    assert "destination" in error.headers["message"]


class CountingUnit(Unit):
    """A unit recording the queue and the number of deliveries of every settle."""

    settled: list[tuple[str, int]]

    def settle(self, stream: Any, kind: Any, delivery_ids: Any, *args: Any, **kw: Any) -> None:
        self.settled.append((stream.queue, len(delivery_ids)))
        super().settle(stream, kind, delivery_ids, *args, **kw)


async def test_acks_of_one_subscription_in_a_read_settle_as_one(stub: StubNode) -> None:
    unit = CountingUnit(stub.core, stub.outlets, stub._apply, lambda queue: None, None)
    unit.settled = []
    stub.unit = lambda: unit  # type: ignore[method-assign]
    session, out = await new_session(stub)
    for i in range(5):
        await session.receive(encode_frame("SEND", {"destination": "q"}, b"%d" % i))
    for queue in ("q", "p"):
        await session.receive(
            encode_frame(
                "SUBSCRIBE", {"destination": queue, "id": queue, "ack": "client-individual"}
            )
        )
    await session.receive(encode_frame("SEND", {"destination": "p"}, b"p"))
    ids = [f.headers["ack"] for f in frames_of(session, drain(out))]
    acks = [encode_frame("ACK", {"id": i}) for i in ids[:5]]
    last = encode_frame("ACK", {"id": ids[4], "receipt": "r"})
    await session.receive(
        b"".join([*acks[:2], encode_frame("ACK", {"id": ids[5]}), *acks[2:4], last])
    )
    assert unit.settled == [("q", 2), ("p", 1), ("q", 3)]
    assert (stub.core.queue("q").depth, stub.core.queue("p").depth) == (0, 0)
    assert [f.headers["receipt-id"] for f in frames_of(session, drain(out))] == ["r"]
