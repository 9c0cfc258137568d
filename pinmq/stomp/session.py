"""The STOMP protocol state machine of one connection, over the node's pure core.

A `Session` turns client frames into core calls (send, subscribe, ack, release, reject,
close_consumer) and hands their Effects to `Engine.apply`, exactly as the gRPC shell does; each
SUBSCRIBE registers a `ConsumerStream`, so deliveries take the node's one delivery path. It
does no socket I/O: outgoing frames (and the node's deliveries) go to `out`, which the
connection's writer drains, and `render` turns deliveries into MESSAGE frames.

Frames of one read are handled one by one, but their Effects are merged and applied together
in `flush`, so a burst of SENDs or ACKs costs one store write. RECEIPT frames go out in the
order of their frames, each only once the store write it depends on is on disk. SENDs go
through the node's one send path (`broker/sending.py`); a SEND (or COMMIT) whose group needs
a cluster grouping decision is awaited before the next frame is read, so frames keep their order.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

from broker.clock import now_ns
from broker.core import CoreError, QueueExists
from broker.engine import ConsumerStream, Engine
from broker.message import GROUP_ID_HEADER, GROUP_SEQ_HEADER
from broker.queue import Delivery, Effects
from broker.sending import Outgoing, SendPath
from broker.store import StoreError
from pinmq.stomp.frames import (
    ESCAPING_VERSIONS,
    Frame,
    FrameError,
    FrameParser,
    Limits,
    encode_frame,
    escape,
    escape_10_key,
    escape_10_value,
)

VERSIONS: Final = ("1.0", "1.1", "1.2")
try:
    SERVER: Final = f"pinmq/{importlib.metadata.version('pinmq')}"
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    SERVER: Final = "pinmq"  # type: ignore[misc]
ACK_MODES: Final = frozenset({"auto", "client", "client-individual"})
PREFETCH_HEADERS: Final = ("activemq.prefetchSize", "prefetch-count")
DELIVERY_COUNT_HEADER: Final = "JMSXDeliveryCount"
MAX_SUBSCRIPTIONS: Final = 1000  # on one connection
MAX_TRANSACTIONS: Final = 1000  # open at once on one connection
MAX_TRANSACTION_BYTES: Final = 64 * 1024 * 1024  # bodies buffered by one connection's transactions

# SEND headers that steer the broker rather than travel with the message.
_SEND_ONLY = frozenset({"destination", "receipt", "transaction", "content-length", "persistent"})
# MESSAGE headers the broker sets; a sender's header of the same name is not passed on.
_MESSAGE_OWN = frozenset(
    {
        "subscription",
        "message-id",
        "destination",
        "ack",
        "content-length",
        "persistent",
        "redelivered",
        DELIVERY_COUNT_HEADER,
    }
)
_AUTO, _CLIENT, _INDIVIDUAL = 0, 1, 2
_MODES = {"auto": _AUTO, "client": _CLIENT, "client-individual": _INDIVIDUAL}


class ProtocolError(Exception):
    """A frame the session refuses: it becomes an ERROR frame and the connection closes."""


class _Close:
    """Put on `out` after the last frame: the writer closes the connection there."""


CLOSE: Final = _Close()


# ---- pure helpers -----------------------------------------------------------------------------


def negotiate_version(accept_version: str | None) -> str | None:
    """The highest version both sides speak; a CONNECT without accept-version means 1.0."""
    if accept_version is None:
        return "1.0"
    offered = {v.strip() for v in accept_version.split(",")}
    common = [v for v in VERSIONS if v in offered]
    return common[-1] if common else None


def negotiate_heart_beat(client: str | None, server_ms: int) -> tuple[int, int]:
    """(ms between the node's heart-beats, ms the node expects between the client's); 0 = off.

    The client's `cx,cy` says how often it can send and wants to receive; the node offers
    `server_ms` both ways, so each direction runs at the slower of the two (STOMP 1.1).
    """
    if not client or not server_ms:
        return 0, 0
    cx_raw, sep, cy_raw = client.partition(",")
    try:
        cx, cy = int(cx_raw), int(cy_raw)
    except ValueError:
        cx = cy = -1
    if not sep or cx < 0 or cy < 0:
        raise ProtocolError(f"invalid heart-beat header {client[:40]!r}: expected 'cx,cy'")
    return (max(server_ms, cy) if cy else 0), (max(server_ms, cx) if cx else 0)


def queue_name(destination: str) -> str:
    """`/queue/NAME` or a bare `NAME` names the anycast queue (and address) NAME."""
    name = destination.removeprefix("/queue/") if destination.startswith("/queue/") else None
    if name is None and not destination.startswith("/"):
        name = destination
    if not name:
        raise ProtocolError(
            f"unsupported destination {destination[:100]!r}: expected /queue/NAME or NAME"
        )
    return name


def prefetch_of(headers: Mapping[str, str], default: int) -> int:
    for key in PREFETCH_HEADERS:
        raw = headers.get(key)
        if raw is not None:
            try:
                value = int(raw)
            except ValueError:
                value = 0
            if value < 1:
                raise ProtocolError(f"{key} must be a positive integer, got {raw[:20]!r}")
            return value
    return default


def _required(frame: Frame, name: str) -> str:
    value = frame.headers.get(name)
    if value is None:
        raise ProtocolError(f"{frame.command} frame requires a {name!r} header")
    return value


# ---- subscriptions and transactions -------------------------------------------------------------


@dataclass(slots=True, eq=False)
class Subscription:
    """One SUBSCRIBE: a consumer of the core, with the bookkeeping its ack mode needs."""

    id: str
    consumer_id: str
    queue: str
    mode: int  # _AUTO, _CLIENT or _INDIVIDUAL
    stream: ConsumerStream
    head: str  # "MESSAGE\nsubscription:ID\n", rendered once
    ack_prefix: str | None  # "ack:CONSUMER/" (STOMP 1.2, acknowledged modes)
    first_line: str | None  # "<group-first-key>:true\n" when the queue sets one
    # client mode: (delivery id, msg id) in delivery order, for cumulative acks
    outstanding: deque[tuple[int, int]] = field(default_factory=deque)

    def take_upto(self, delivery_id: int) -> list[tuple[int, int]]:
        """Cumulative ack: every outstanding delivery up to and including `delivery_id`."""
        out = []
        outstanding = self.outstanding
        while outstanding and outstanding[0][0] <= delivery_id:
            out.append(outstanding.popleft())
        return out


@dataclass(slots=True)
class _Settle:
    sub: Subscription
    delivery_id: int
    msg_id: int | None
    kind: str  # "ack", "release" or "reject"


@dataclass(slots=True)
class _Transaction:
    ops: list[Outgoing | _Settle] = field(default_factory=list)
    size: int = 0


# ---- the session ------------------------------------------------------------------------------


class Session:
    """Protocol state of one STOMP connection; the server feeds it bytes and drains `out`."""

    def __init__(
        self,
        node: Engine,
        sending: SendPath,
        session_id: str,
        out: asyncio.Queue[Any],
        peer: str,
    ) -> None:
        self.node = node
        self.sending = sending
        self.core = node.core
        self.id = session_id
        self.peer = peer
        self.out = out
        self.settings = node.config.stomp
        self.max_message_size = node.config.limits.max_message_size
        s = self.settings
        self.parser = FrameParser(Limits(s.max_frame_size, s.max_headers, s.max_header_size))
        self.version: str | None = None  # set by CONNECT
        self.heart_beat = (0, 0)  # (ms between our heart-beats, ms expected from the client)
        self.closing = False  # no more frames are read; the connection closes after `out`
        self.on_closing: Callable[[], None] | None = None  # the shell's watchdog
        self.error: str | None = None  # what the ERROR frame said, if one was sent
        self.pending_bytes = 0  # control frames queued on `out`, not yet written
        self.drained = asyncio.Event()
        self.subs: dict[str, Subscription] = {}
        self.by_consumer: dict[str, Subscription] = {}
        # STOMP 1.0/1.1 acknowledge by message-id: msg id -> (subscription, delivery id)
        self.by_msg_id: dict[int, tuple[Subscription, int]] = {}
        self.txs: dict[str, _Transaction] = {}
        self._tx_bytes = 0
        self._n_subs = 0
        self._name = session_id
        self._now = 0
        self._fx: Effects | None = None
        self._receipts: list[str] = []
        self._chain: deque[tuple[asyncio.Future[None] | None, bytes | _Close]] = deque()
        self._out_closed = False
        self._dests: dict[str, str] = {}
        self._esc_key: Any = escape_10_key
        self._esc_value: Any = escape_10_value
        self._handlers = {
            "CONNECT": self._connect,
            "STOMP": self._connect,
            "SEND": self._send,
            "SUBSCRIBE": self._subscribe,
            "UNSUBSCRIBE": self._unsubscribe,
            "ACK": self._ack,
            "NACK": self._nack,
            "BEGIN": self._begin,
            "COMMIT": self._commit,
            "ABORT": self._abort,
            "DISCONNECT": self._disconnect,
        }

    # ---- input ----------------------------------------------------------------------------

    async def receive(self, data: bytes) -> None:
        """Handle every complete frame in what has arrived so far."""
        self.parser.feed(data)
        self._now = now_ns()
        try:
            while not self.closing:
                try:
                    frame = self.parser.next()
                except FrameError as err:
                    self.fail(str(err))
                    return
                if frame is None:
                    return
                try:
                    pending = self.handle(frame)
                    if pending is not None:
                        self.flush()
                        await pending
                except (ProtocolError, CoreError, StoreError) as err:
                    self.fail(str(err), frame.headers.get("receipt"))
                    return
                receipt = frame.headers.get("receipt")
                if receipt is not None and frame.command not in ("CONNECT", "STOMP", "DISCONNECT"):
                    self._receipts.append(receipt)
        finally:
            self.flush()

    def handle(self, frame: Frame) -> Awaitable[None] | None:
        """Apply one frame to the core; returns an awaitable when it must wait (queue creation)."""
        command = frame.command
        if self.version is None and command not in ("CONNECT", "STOMP"):
            raise ProtocolError(f"expected a CONNECT or STOMP frame first, got {command}")
        handler = self._handlers.get(command)
        if handler is None:
            raise ProtocolError(f"unknown command {command[:40]!r}")
        return handler(frame)

    # ---- frames ---------------------------------------------------------------------------

    def _connect(self, frame: Frame) -> None:
        if self.version is not None:
            raise ProtocolError("already connected: a second CONNECT/STOMP frame")
        supported = ",".join(VERSIONS)
        version = negotiate_version(frame.headers.get("accept-version"))
        if version is None:
            self.fail(
                f"supported protocol versions are {supported}",
                headers={"version": supported},
            )
            return
        heart_beat = (
            negotiate_heart_beat(frame.headers.get("heart-beat"), self.settings.heart_beat_ms)
            if version != "1.0"
            else (0, 0)
        )
        self.version, self.heart_beat = version, heart_beat
        if version in ESCAPING_VERSIONS:
            self.parser.escaping = True
            self._esc_key = self._esc_value = escape
        self._name = frame.headers.get("client-id") or f"{self.id}@{self.peer}"
        headers = {"version": version, "server": SERVER, "session": self.id}
        if version != "1.0":
            headers["heart-beat"] = f"{heart_beat[0]},{heart_beat[1]}"
        self._emit_after(None, encode_frame("CONNECTED", headers, version=version))

    def _send(self, frame: Frame) -> Awaitable[None] | None:
        h = frame.headers
        address = queue_name(_required(frame, "destination"))
        body = frame.body
        if len(body) + 4096 > self.max_message_size:
            size = len(body) + sum(len(k) + len(v) for k, v in h.items())
            if size > self.max_message_size:
                raise ProtocolError(
                    f"message of {size} bytes exceeds the max-message-size of "
                    f"{self.max_message_size} bytes"
                )
        headers = {k: v for k, v in h.items() if k not in _SEND_ONLY}
        persistent = h.get("persistent", "").lower() == "true"
        message = Outgoing(address, body, headers, persistent)
        tx = h.get("transaction")
        if tx is not None:
            self._buffer(tx, message, len(body))
            return None
        return self._route([message])

    def _route(self, batch: list[Outgoing]) -> Awaitable[None] | None:
        """Route SENDs now, or return what awaits their grouping decisions and routes them.

        The caller awaits it before the next frame, so a connection's frames keep their order.
        """
        sent = self.sending.send_now(batch, self._now)
        if sent is None:
            return self._route_later(batch)
        self._add(sent[1])
        return None

    async def _route_later(self, batch: list[Outgoing]) -> None:
        _, fx = await self.sending.send(batch)
        self._add(fx)
        self._now = now_ns()

    def _subscribe(self, frame: Frame) -> Awaitable[None] | None:
        h = frame.headers
        destination = _required(frame, "destination")
        queue = queue_name(destination)
        sub_id = h.get("id")
        if sub_id is None:
            if self.version != "1.0":
                raise ProtocolError("SUBSCRIBE frame requires an 'id' header")
            sub_id = destination
        if sub_id in self.subs:
            raise ProtocolError(f"subscription id {sub_id!r} is already in use")
        if len(self.subs) >= MAX_SUBSCRIPTIONS:
            raise ProtocolError(f"more than {MAX_SUBSCRIPTIONS} subscriptions on one connection")
        mode = h.get("ack", "auto")
        if mode not in ACK_MODES:
            raise ProtocolError(
                f"unknown ack mode {mode[:40]!r}: expected auto, client or client-individual"
            )
        prefetch = prefetch_of(h, self.settings.default_prefetch)
        if self._may_create(queue):
            return self._create_and_subscribe(queue, sub_id, mode, prefetch)
        self._register(queue, sub_id, mode, prefetch)
        return None

    def _may_create(self, queue: str) -> bool:
        """Whether SUBSCRIBE must auto-create `queue` (Artemis: auto-create-queues)."""
        core = self.core
        if any(q.name == queue or q.address == queue for q in core.queues()):
            return False
        if queue in self.node.config.addresses:
            return False
        rules = self.node.config.settings_for(queue)
        return rules.auto_create_addresses and rules.auto_create_queues

    async def _create_and_subscribe(
        self, queue: str, sub_id: str, mode: str, prefetch: int
    ) -> None:
        with contextlib.suppress(QueueExists):  # a SEND may have created it meanwhile
            await self.node.create_queue(queue, queue, self.node.config.queue_config_for(queue))
        self._now = now_ns()
        self._register(queue, sub_id, mode, prefetch)

    def _register(self, queue: str, sub_id: str, mode: str, prefetch: int) -> None:
        self._n_subs += 1
        consumer_id = f"{self.id}-{self._n_subs}"
        fx = self.core.subscribe(queue, consumer_id, f"{self._name}/{sub_id}", prefetch, self._now)
        stream = ConsumerStream(consumer_id, queue, outbound=self.out)
        first_key = self.core.queue(queue).settings.group_first_key
        esc_key, esc_value = self._esc_key, self._esc_value
        sub = Subscription(
            id=sub_id,
            consumer_id=consumer_id,
            queue=queue,
            mode=_MODES[mode],
            stream=stream,
            head=f"MESSAGE\nsubscription:{esc_value(sub_id)}\n",
            ack_prefix=(
                f"ack:{consumer_id}/" if self.version == "1.2" and mode != "auto" else None
            ),
            first_line=f"{esc_key(first_key)}:true\n" if first_key else None,
        )
        self.node.streams[consumer_id] = stream
        self.subs[sub_id] = sub
        self.by_consumer[consumer_id] = sub
        stream.ended.add_done_callback(partial(self._stream_ended, sub))
        self._add(fx)
        self.node.consumers_changed(queue)

    def _unsubscribe(self, frame: Frame) -> None:
        sub_id = frame.headers.get("id")
        destination = frame.headers.get("destination")
        if sub_id is None and self.version == "1.0" and destination is not None:
            # STOMP 1.0 may name the subscription by its destination instead.
            queue = queue_name(destination)
            sub_id = next((s.id for s in self.subs.values() if s.queue == queue), destination)
        if sub_id is None:
            raise ProtocolError("UNSUBSCRIBE frame requires an 'id' header")
        sub = self.subs.pop(sub_id, None)
        if sub is None:
            raise ProtocolError(f"no subscription {sub_id!r} on this connection")
        self._close_subscription(sub)
        if self.by_msg_id:
            self.by_msg_id = {k: v for k, v in self.by_msg_id.items() if v[0] is not sub}

    def _ack(self, frame: Frame) -> None:
        self._settle_frame(frame, "ack")

    def _nack(self, frame: Frame) -> None:
        requeue = frame.headers.get("requeue", "true").lower() != "false"
        self._settle_frame(frame, "release" if requeue else "reject")

    def _settle_frame(self, frame: Frame, kind: str) -> None:
        target = self._target(frame)
        if target is None:
            return
        sub, delivery_id, msg_id = target
        tx = frame.headers.get("transaction")
        if tx is not None:
            self._buffer(tx, _Settle(sub, delivery_id, msg_id, kind), 0)
            return
        self._settle(_Settle(sub, delivery_id, msg_id, kind))

    def _target(self, frame: Frame) -> tuple[Subscription, int, int | None] | None:
        """The delivery an ACK/NACK names; None when its subscription is gone (a no-op)."""
        h = frame.headers
        if self.version == "1.2":
            key = _required(frame, "id")
            consumer_id, sep, raw = key.rpartition("/")
            if not (sep and raw.isascii() and raw.isdigit()):
                raise ProtocolError(f"unknown ack id {key[:100]!r}")
            sub = self.by_consumer.get(consumer_id)
            if sub is None:
                if consumer_id.startswith(f"{self.id}-"):
                    return None  # unsubscribed: its messages went back to the queue
                raise ProtocolError(f"ack id {key[:100]!r} is not from this connection")
            return sub, int(raw), None
        raw = h.get("message-id")
        if raw is None:
            raise ProtocolError(f"{frame.command} frame requires a 'message-id' header")
        try:
            msg_id = int(raw)
        except ValueError:
            raise ProtocolError(f"unknown message-id {raw[:100]!r}") from None
        found = self.by_msg_id.get(msg_id)
        if found is None:
            return None  # acknowledged already (or never delivered here)
        return found[0], found[1], msg_id

    def _settle(self, op: _Settle) -> None:
        sub = op.sub
        if sub.mode == _AUTO or sub.consumer_id not in self.by_consumer:
            return  # auto: acknowledged when written; gone: returned to the queue
        by_msg_id = self.by_msg_id
        if op.kind == "ack" and sub.mode == _CLIENT:
            taken = sub.take_upto(op.delivery_id)
            if not taken:
                return
            ids = [d for d, _ in taken]
            if by_msg_id:
                for _, msg_id in taken:
                    by_msg_id.pop(msg_id, None)
        else:
            ids = [op.delivery_id]
            if op.msg_id is not None:
                by_msg_id.pop(op.msg_id, None)
        settle = getattr(self.core, op.kind)  # ack, release or reject
        self._add(settle(sub.queue, sub.consumer_id, ids, self._now))

    def _begin(self, frame: Frame) -> None:
        tx = _required(frame, "transaction")
        if tx in self.txs:
            raise ProtocolError(f"transaction {tx!r} has already begun")
        if len(self.txs) >= MAX_TRANSACTIONS:
            raise ProtocolError(f"more than {MAX_TRANSACTIONS} open transactions")
        self.txs[tx] = _Transaction()

    def _commit(self, frame: Frame) -> Awaitable[None] | None:
        """Apply a transaction's frames in one go: all of them or, on an error, none.

        Its SENDs are routed as one batch first; its ACK/NACKs follow once they are.
        """
        t = self._pop_tx(frame)
        sends = [op for op in t.ops if isinstance(op, Outgoing)]
        settles = [op for op in t.ops if isinstance(op, _Settle)]
        routing = self._route(sends) if sends else None
        if routing is None:
            for op in settles:
                self._settle(op)
            return None
        return self._settle_after(routing, settles)

    async def _settle_after(self, routing: Awaitable[None], settles: list[_Settle]) -> None:
        await routing
        for op in settles:
            self._settle(op)

    def _abort(self, frame: Frame) -> None:
        """Discard a transaction; messages it acknowledged stay unacknowledged."""
        self._pop_tx(frame)

    def _disconnect(self, frame: Frame) -> None:
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            self._receipts.append(receipt)
        self.close()
        self._set_closing()
        self._emit_after(None, CLOSE)

    def _buffer(self, tx: str, op: Outgoing | _Settle, size: int) -> None:
        t = self.txs.get(tx)
        if t is None:
            raise ProtocolError(f"no transaction {tx!r} on this connection")
        if self._tx_bytes + size > MAX_TRANSACTION_BYTES:
            raise ProtocolError(
                f"transactions hold more than {MAX_TRANSACTION_BYTES} bytes of messages"
            )
        t.ops.append(op)
        t.size += size
        self._tx_bytes += size

    def _pop_tx(self, frame: Frame) -> _Transaction:
        tx = _required(frame, "transaction")
        t = self.txs.pop(tx, None)
        if t is None:
            raise ProtocolError(f"no transaction {tx!r} on this connection")
        self._tx_bytes -= t.size
        return t

    # ---- ending -----------------------------------------------------------------------------

    def close(self) -> None:
        """The connection ends: uncommitted transactions are discarded and every consumer is
        closed, so unacknowledged messages return to the head of their groups in order."""
        self.txs.clear()
        self._tx_bytes = 0
        subs = list(self.subs.values())
        self.subs.clear()
        self.by_msg_id.clear()
        for sub in subs:
            self._close_subscription(sub)
        self.flush()

    def fail(
        self, message: str, receipt: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        """Send an ERROR frame naming the problem, then close (STOMP requires both)."""
        if self.closing:
            return
        self.error = message
        self._set_closing()
        self.flush()
        error = {"message": message, "content-type": "text/plain"}
        if receipt is not None:
            error["receipt-id"] = receipt
        error.update(headers or {})
        self._emit_after(None, encode_frame("ERROR", error, message.encode(), self.version))
        self._emit_after(None, CLOSE)

    def _set_closing(self) -> None:
        if not self.closing:
            self.closing = True
            if self.on_closing is not None:
                self.on_closing()

    def _close_subscription(self, sub: Subscription) -> None:
        del self.by_consumer[sub.consumer_id]
        self.node.streams.pop(sub.consumer_id, None)
        self._add(self.core.close_consumer(sub.queue, sub.consumer_id, now_ns()))
        self.node.consumers_changed(sub.queue)

    def _stream_ended(self, sub: Subscription, ended: asyncio.Future[tuple[str, str]]) -> None:
        """The node ended a subscription (queue deleted, node stopping): STOMP can only ERROR."""
        if sub.consumer_id in self.by_consumer and not ended.cancelled():
            _, reason = ended.result()
            self.fail(reason, headers={"subscription": sub.id})

    # ---- effects and output -------------------------------------------------------------------

    def _add(self, fx: Effects) -> None:
        if self._fx is None:
            self._fx = fx
        else:
            self._fx.merge(fx)

    def flush(self) -> None:
        """Apply the Effects gathered since the last flush; queue their RECEIPTs behind them."""
        fx, self._fx = self._fx, None
        write = self.node.apply(fx) if fx is not None else None
        if self._receipts:
            version = self.version
            for receipt in self._receipts:
                self._emit_after(
                    write, encode_frame("RECEIPT", {"receipt-id": receipt}, b"", version)
                )
            self._receipts = []

    def _emit_after(self, gate: asyncio.Future[None] | None, item: bytes | _Close) -> None:
        """Queue `item` once `gate` (a store write) resolved and everything queued before it."""
        waiting = gate is not None and not gate.done()
        if not self._chain and not waiting:
            self._emit(gate, item)
            return
        self._chain.append((gate, item))
        if waiting:
            gate.add_done_callback(self._advance)  # type: ignore[union-attr]

    def _advance(self, _done: object = None) -> None:
        chain = self._chain
        while chain:
            gate, item = chain[0]
            if gate is not None and not gate.done():
                return
            chain.popleft()
            self._emit(gate, item)

    def _emit(self, gate: asyncio.Future[None] | None, item: bytes | _Close) -> None:
        if gate is not None and (gate.cancelled() or gate.exception() is not None):
            if not self._out_closed:
                reason = "cancelled" if gate.cancelled() else str(gate.exception())
                message = f"store write failed: {reason}"
                error = {"message": message, "content-type": "text/plain"}
                self._set_closing()
                self._put(encode_frame("ERROR", error, message.encode(), self.version))
                self._put(CLOSE)
            return
        self._put(item)

    def _put(self, item: bytes | _Close) -> None:
        if self._out_closed:
            return
        if item is CLOSE:
            self._out_closed = True
        else:
            self.pending_bytes += len(item)  # type: ignore[arg-type]
        self.out.put_nowait(item)

    def heart_beat_now(self) -> None:
        """An EOL on an idle connection, so the client knows the node is alive."""
        self._put(b"\n")

    def written(self, nbytes: int) -> None:
        """The writer sent `nbytes` of queued control frames."""
        self.pending_bytes -= nbytes

    # ---- deliveries -----------------------------------------------------------------------------

    def render(
        self,
        deliveries: list[Delivery],
        parts: list[bytes],
        auto: dict[Subscription, list[int]] | None,
    ) -> dict[Subscription, list[int]] | None:
        """Append MESSAGE frames for `deliveries` to `parts`; returns auto-mode ids to ack.

        Deliveries of a subscription that has ended meanwhile are dropped: closing its
        consumer already returned them to the queue.
        """
        by_consumer, dests = self.by_consumer, self._dests
        esc_key, esc_value = self._esc_key, self._esc_value
        track_msg_ids = self.version != "1.2"
        for d in deliveries:
            sub = by_consumer.get(d.consumer_id)
            if sub is None:
                continue
            m = d.message
            did = d.delivery_id
            dest = dests.get(m.address)
            if dest is None:
                dest = dests[m.address] = f"destination:/queue/{esc_value(m.address)}\n"
            extra = "" if sub.ack_prefix is None else f"{sub.ack_prefix}{did}\n"
            if m.persistent:
                extra += "persistent:true\n"
            if m.delivery_count:
                extra += f"redelivered:true\n{DELIVERY_COUNT_HEADER}:{m.delivery_count + 1}\n"
            h = m.headers
            if m.group is not None:
                if GROUP_ID_HEADER not in h:
                    extra += f"{GROUP_ID_HEADER}:{esc_value(m.group)}\n"
                if GROUP_SEQ_HEADER not in h and m.group_seq:
                    extra += f"{GROUP_SEQ_HEADER}:{m.group_seq}\n"
            if d.first_in_group and sub.first_line is not None:
                extra += sub.first_line
            user = "".join(
                [f"{esc_key(k)}:{esc_value(v)}\n" for k, v in h.items() if k not in _MESSAGE_OWN]
            )
            body = m.body
            text = (
                f"{sub.head}message-id:{m.msg_id}\n{dest}{extra}{user}"
                f"content-length:{len(body)}\n\n"
            )
            if "\0" in text:
                text = text.replace("\0", "\ufffd")
            parts += (text.encode(), body, b"\0")
            mode = sub.mode
            if mode == _AUTO:
                if auto is None:
                    auto = {}
                ids = auto.get(sub)
                if ids is None:
                    auto[sub] = [did]
                else:
                    ids.append(did)
                continue
            if mode == _CLIENT:
                sub.outstanding.append((did, m.msg_id))
            if track_msg_ids:
                self.by_msg_id[m.msg_id] = (sub, did)
        return auto

    def auto_ack(self, auto: dict[Subscription, list[int]]) -> None:
        """Acknowledge auto-mode deliveries once they were written to the socket."""
        now = now_ns()
        for sub, ids in auto.items():
            if sub.consumer_id in self.by_consumer:
                self._add(self.core.ack(sub.queue, sub.consumer_id, ids, now))
        self.flush()
