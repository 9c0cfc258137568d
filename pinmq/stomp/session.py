"""The STOMP protocol state machine of one connection, over the node's engine.

A `Session` turns client frames into the engine's commands (send, subscribe, ack, release,
reject, unsubscribe), exactly as the gRPC shell does; each SUBSCRIBE's `ConsumerStream` writes
into the connection's `out`, so deliveries take the node's one delivery path. It does no
socket I/O: outgoing frames (and the node's deliveries) go to `out`, which the connection's
writer drains, and `render` turns deliveries into MESSAGE frames.

Frames of one read are handled one by one in the session's `Unit`, committed together in
`flush` (and before anything is awaited), so a burst of SENDs or ACKs costs one store write.
Consecutive SENDs outside transactions, and consecutive ACKs of one client-individual
subscription, form a run that is applied as one command (one routing, one settle) when a
frame of another kind, a `receipt` header or the end of the read ends it; what a frame after
the run does is applied after it, so frames keep their order. If a run's routing is refused,
its SENDs are routed one by one and the first refused one is named.
RECEIPT frames go out in the order of their frames, each only once the store write it depends
on is on disk. SENDs go through the node's one send path (`broker/sending.py`); a SEND (or
COMMIT) whose group needs a cluster grouping decision is awaited before the next frame is
read, so frames keep their order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from broker import validation
from broker.access import OPEN, Access
from broker.authenticator import Authenticator
from broker.clock import now_ns
from broker.core import CoreError
from broker.effects import Delivery
from broker.engine import Engine
from broker.message import GROUP_SEQ_HEADER, Outgoing
from broker.permissions import Denied
from broker.refusals import Refusals
from broker.sending import SendPath
from broker.store import StoreError
from pinmq.stomp.connect import Connecting
from pinmq.stomp.frames import (
    Frame,
    FrameError,
    FrameParser,
    Limits,
    encode_frame,
    escape_10_key,
    escape_10_value,
)
from pinmq.stomp.outbox import Outbox
from pinmq.stomp.protocol import (
    AUTO,
    CLIENT,
    CLOSE,
    INDIVIDUAL,
    SEND_ONLY,
    Close,
    ProtocolError,
    Settle,
    Subscription,
    Transactions,
    ack_target,
    queue_name,
    required,
)
from pinmq.stomp.render import render_messages
from pinmq.stomp.subscribing import Subscribing

# Frames in one run at most: a run's room (memory, disk) is checked once, for all of them.
RUN_MAX = 100

# ---- the session ------------------------------------------------------------------------------


class Session(Connecting, Subscribing):
    """Protocol state of one STOMP connection; the server feeds it bytes and drains `out`."""

    def __init__(
        self,
        engine: Engine,
        sending: SendPath,
        session_id: str,
        out: asyncio.Queue[Any],
        peer: str,
        authenticator: Authenticator | None = None,
        certificate: str | None = None,
        refusals: Refusals | None = None,
    ) -> None:
        self.engine = engine
        self.refusals = refusals if refusals is not None else Refusals()
        self.authenticator = authenticator  # None: security off, every client may do anything
        self.certificate = certificate  # a verified client certificate's subject (common name)
        self.access: Access = OPEN  # what this connection's user may do, once CONNECTed
        self.sending = sending
        self.unit = engine.unit()  # this connection's commands, committed by `flush`
        self.id = session_id
        self.peer = peer
        self.out = out
        self.settings = engine.config.stomp
        self.max_message_size = engine.config.limits.max_message_size
        s = self.settings
        self.parser = FrameParser(Limits(s.max_frame_size, s.max_headers, s.max_header_size))
        self.version: str | None = None  # set by CONNECT
        self.frames = 0  # frames received
        self.heart_beat = (0, 0)  # (ms between our heart-beats, ms expected from the client)
        self.closing = False  # no more frames are read; the connection closes after `out`
        self.on_closing: Callable[[], None] | None = None  # the shell's watchdog
        self.error: str | None = None  # what the ERROR frame said, if one was sent
        self.drained = asyncio.Event()
        self.subs: dict[str, Subscription] = {}
        self.by_consumer: dict[str, Subscription] = {}
        # STOMP 1.0/1.1 acknowledge by message-id: msg id -> (subscription, delivery id)
        self.by_msg_id: dict[int, tuple[Subscription, int]] = {}
        memory = engine.memory  # transactions and partial frames count there too
        self.txs = Transactions(engine.config.limits.max_batch_messages, memory)
        self._memory = memory
        self.partial = 0  # bytes of a partial frame counted on the node's memory
        self._n_subs = 0
        self._name = session_id
        self._now = 0
        self._receipts: list[str] = []
        # The run: SENDs (or client-individual ACKs of `_run_sub`) applied as one command.
        self._run: list[Any] = []
        self._run_sub: Subscription | None = None
        self._run_command = ""
        self._run_max = min(RUN_MAX, engine.config.limits.max_batch_messages)
        self.outbox = Outbox(out, self._write_failed)
        self.dests: dict[str, str] = {}
        self.esc_key: Any = escape_10_key
        self.esc_value: Any = escape_10_value
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
                    if await self._end_run():  # the frames before it count
                        self.refuse("INVALID_ARGUMENT", str(err))
                    return
                if frame is None:
                    await self._end_run()
                    return
                self.frames += 1
                receipt = frame.headers.get("receipt")
                blame = None  # the receipt an error names: a run ended by another frame has none
                try:
                    if self._run and not (
                        frame.command == self._run_command and "transaction" not in frame.headers
                    ):
                        pending = self._end_run_now()
                        if pending is not None:
                            self.flush()
                            await pending
                    blame = receipt
                    pending = self.handle(frame)
                    if pending is not None:
                        self.flush()
                        await pending
                    if self._run and (receipt is not None or len(self._run) >= self._run_max):
                        pending = self._end_run_now()  # the frame joined the run, and ends it
                        if pending is not None:
                            self.flush()
                            await pending
                except (ProtocolError, CoreError, StoreError, Denied) as err:
                    if await self._end_run():  # the frame's own error: the run before it first
                        self.refuse(_reason(err), str(err), blame)
                        if isinstance(err, Denied) and self.authenticator is not None:
                            self.authenticator.denied(err, self.peer)
                    return
                if receipt is not None and frame.command not in ("CONNECT", "STOMP", "DISCONNECT"):
                    self._receipts.append(receipt)
        finally:
            self.flush()
            self._count_partial()

    # ---- runs: consecutive SENDs (or ACKs of one subscription) of a read as one command ---

    def _end_run_now(self) -> Awaitable[None] | None:
        """Apply the run: its ACKs at once, its SENDs routed as one batch (what to await when
        they must wait). Raises CoreError (or StoreError) for what the run's frames did."""
        run, sub = self._run, self._run_sub
        if not run:
            return None
        self._run, self._run_sub = [], None
        if sub is not None:
            self.unit.settle(sub.stream, "ack", run, now=self._now)
            return None
        try:
            return self._route(run)
        except CoreError:  # nothing of it was routed: one by one, to stop at the failing one
            if len(run) == 1:
                raise
        return self._route_each(run)

    async def _route_each(self, sends: list[Outgoing]) -> None:
        for message in sends:
            pending = self._route([message])
            if pending is not None:
                self.flush()
                await pending

    async def _end_run(self) -> bool:
        """Apply the run, if any; False if that failed (the session refused and is closing)."""
        if not self._run:
            return True
        try:
            pending = self._end_run_now()
            if pending is not None:
                self.flush()
                await pending
        except (ProtocolError, CoreError, StoreError, Denied) as err:
            self.refuse(_reason(err), str(err))
            return False
        return True

    def _count_partial(self) -> None:
        """Keep the node's memory meter in step with this connection's partial frame."""
        buffered = self.parser.buffered
        if buffered != self.partial:
            self._memory.add(buffered - self.partial)
            self.partial = buffered

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

    def _send(self, frame: Frame) -> Awaitable[None] | None:
        h = frame.headers
        address = queue_name(required(frame, "destination"))
        body = frame.body
        headers = {k: v for k, v in h.items() if k not in SEND_ONLY}
        try:
            validation.check_size(body, headers, self.max_message_size)
            persistent = validation.persistent(h.get("persistent"))
            seq = headers.get(GROUP_SEQ_HEADER)
            if seq is not None:
                validation.group_seq(seq)
        except validation.InvalidInput as err:
            raise ProtocolError(str(err)) from None
        self.access.check_send((address,), self.engine.creates)
        message = Outgoing(address, body, headers, persistent)
        tx = h.get("transaction")
        if tx is None:
            self._run.append(message)  # routed with the rest of the run (see `receive`)
            self._run_command = "SEND"
            return None
        room = self.engine.admit([(address, persistent)])  # a buffered frame holds memory too
        if room is None:
            self.txs.buffer(tx, message, len(body))
            return None
        return self._buffer_later(tx, message, room)

    async def _buffer_later(self, tx: str, message: Outgoing, room: Awaitable[None]) -> None:
        await room
        self.txs.buffer(tx, message, len(message.body))

    def _route(self, batch: list[Outgoing]) -> Awaitable[None] | None:
        """Route SENDs now, or return what awaits their grouping decisions and routes them.

        The caller awaits it before the next frame, so a connection's frames keep their order.
        """
        wait = self.engine.admit(list(dict.fromkeys((m.address, m.persistent) for m in batch)))
        if wait is not None:  # address-full-policy BLOCK or a full disk: no RECEIPT till room
            return self._route_later(batch, wait)
        if self.sending.send_now(batch, self.unit, self._now) is None:
            return self._route_later(batch)
        return None

    async def _route_later(
        self, batch: list[Outgoing], room: Awaitable[None] | None = None
    ) -> None:
        if room is not None:
            await room
        await self.sending.send(batch, self.unit)
        self._now = now_ns()

    def _ack(self, frame: Frame) -> None:
        self._settle_frame(frame, "ack")

    def _nack(self, frame: Frame) -> None:
        requeue = frame.headers.get("requeue", "true").lower() != "false"
        self._settle_frame(frame, "release" if requeue else "reject")

    def _settle_frame(self, frame: Frame, kind: str) -> None:
        target = ack_target(frame, self.version, self.id, self.by_consumer, self.by_msg_id)
        if target is None:
            return
        sub, delivery_id, msg_id = target
        tx = frame.headers.get("transaction")
        if tx is not None:
            self.txs.buffer(tx, Settle(sub, delivery_id, msg_id, kind), 0)
            return
        if kind == "ack" and sub.mode == INDIVIDUAL and sub.consumer_id in self.by_consumer:
            if self._run_sub is not sub:
                self._end_run_now()  # another subscription's ACKs: settled at once
                self._run_sub, self._run_command = sub, "ACK"
            self._run.append(delivery_id)  # settled with the rest of the run (see `receive`)
            if msg_id is not None:
                self.by_msg_id.pop(msg_id, None)
            return
        self._end_run_now()
        self._settle(Settle(sub, delivery_id, msg_id, kind))

    def _settle(self, op: Settle) -> None:
        sub = op.sub
        if sub.mode == AUTO or sub.consumer_id not in self.by_consumer:
            return  # auto: acknowledged when written; gone: returned to the queue
        by_msg_id = self.by_msg_id
        if op.kind == "ack" and sub.mode == CLIENT:
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
        self.unit.settle(sub.stream, op.kind, ids, now=self._now)

    def _begin(self, frame: Frame) -> None:
        self.txs.begin(required(frame, "transaction"))

    def _commit(self, frame: Frame) -> Awaitable[None] | None:
        """Apply a transaction's frames in one go: all of them or, on an error, none.

        Its SENDs are routed as one batch first; its ACK/NACKs follow once they are.
        """
        t = self.txs.pop(required(frame, "transaction"))
        sends = [op for op in t.ops if isinstance(op, Outgoing)]
        settles = [op for op in t.ops if isinstance(op, Settle)]
        routing = self._route(sends) if sends else None
        if routing is None:
            for op in settles:
                self._settle(op)
            return None
        return self._settle_after(routing, settles)

    async def _settle_after(self, routing: Awaitable[None], settles: list[Settle]) -> None:
        await routing
        for op in settles:
            self._settle(op)

    def _abort(self, frame: Frame) -> None:
        """Discard a transaction; messages it acknowledged stay unacknowledged."""
        self.txs.pop(required(frame, "transaction"))

    def _disconnect(self, frame: Frame) -> None:
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            self._receipts.append(receipt)
        self.close()
        self._set_closing()
        self._emit_after(None, CLOSE)

    # ---- ending -----------------------------------------------------------------------------

    def close(self) -> None:
        """The connection ends: uncommitted transactions are discarded and every consumer is
        closed, so unacknowledged messages return to the head of their groups in order."""
        self.txs.clear()
        subs = list(self.subs.values())
        self.subs.clear()
        self.by_msg_id.clear()
        for sub in subs:
            self._close_subscription(sub)
        self.flush()
        # A partial frame can be megabytes, and the session sits in reference cycles (its
        # handlers are its own bound methods) that only the cycle collector would free.
        self.parser.release()
        self._count_partial()
        self._handlers = {}
        self.on_closing = None

    def refuse(self, reason: str, message: str, receipt: str | None = None) -> None:
        """`fail`, for a request the node refuses: counted by `reason` (a status code name)."""
        if not self.closing:
            self.refusals.count("stomp", reason)
        self.fail(message, receipt)

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

    # ---- effects and output -------------------------------------------------------------------

    def flush(self) -> None:
        """Commit the commands since the last flush; queue their RECEIPTs behind them."""
        write = self.unit.commit()
        if self._receipts:
            version = self.version
            for receipt in self._receipts:
                self._emit_after(
                    write, encode_frame("RECEIPT", {"receipt-id": receipt}, b"", version)
                )
            self._receipts = []

    def _emit_after(self, gate: asyncio.Future[None] | None, item: bytes | Close) -> None:
        self.outbox.after(gate, item)

    def _write_failed(self, message: str) -> bytes:
        """A store write a frame waited for failed: the ERROR frame to close with."""
        self._set_closing()
        error = {"message": message, "content-type": "text/plain"}
        return encode_frame("ERROR", error, message.encode(), self.version)

    @property
    def pending_bytes(self) -> int:
        """Control frames queued on `out`, not yet written (the reader pauses above a mark)."""
        return self.outbox.pending_bytes

    def heart_beat_now(self) -> None:
        """An EOL on an idle connection, so the client knows the node is alive."""
        self.outbox.put(b"\n")

    def written(self, nbytes: int) -> None:
        """The writer sent `nbytes` of queued control frames."""
        self.outbox.pending_bytes -= nbytes

    # ---- deliveries -----------------------------------------------------------------------------

    def render(
        self,
        deliveries: list[Delivery],
        parts: list[bytes],
        auto: dict[Subscription, list[int]] | None,
    ) -> dict[Subscription, list[int]] | None:
        """MESSAGE frames for `deliveries` appended to `parts` (see `render_messages`)."""
        return render_messages(self, deliveries, parts, auto)

    def auto_ack(self, auto: dict[Subscription, list[int]]) -> None:
        """Acknowledge auto-mode deliveries once they were written to the socket."""
        now = now_ns()
        for sub, ids in auto.items():
            if sub.consumer_id in self.by_consumer:
                self.unit.settle(sub.stream, "ack", ids, now=now)
        self.flush()


def _reason(err: Exception) -> str:
    """The status code name a refusal for `err` counts under (as gRPC would answer it)."""
    if isinstance(err, CoreError):
        return err.code.upper()
    if isinstance(err, StoreError):
        return "UNAVAILABLE"
    if isinstance(err, Denied):
        return "PERMISSION_DENIED"
    return "INVALID_ARGUMENT"  # a frame that breaks the protocol
