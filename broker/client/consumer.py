"""Consuming: a subscription stream that receives batched deliveries and settles them in
batches; with failover, the same subscription goes on at the node the client moved to."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import grpc
from grpc import aio

from broker.audit_schema import MID_HEADER, Kind
from broker.client.base import CONNECT_TIMEOUT_S, Link, SettleKind
from broker.client.errors import (
    ConnectionLost,
    OutcomeUnknown,
    PinmqError,
    from_rpc,
    moved_under,
)
from pinmq_pb import client_pb2 as pb

log = logging.getLogger("pinmq.client")


@dataclass(slots=True, eq=False)
class Received:
    """A delivered message; settle it exactly once with ack, release or reject.

    A message received before its consumer subscribed again (after a failover) can no longer
    be settled: its delivery ended with its stream, and the node delivers it again. Settling
    it does nothing (a debug log says so), or, with `wait`, raises ConnectionLost.
    """

    msg_id: int
    delivery_id: int
    queue: str
    address: str
    body: bytes
    headers: dict[str, str]
    group_id: str | None
    group_seq: int
    delivery_count: int
    persistent: bool
    _consumer: Consumer = field(repr=False)
    _stream: int = field(repr=False)  # the consumer's subscription it came through
    _settled: bool = field(default=False, repr=False)

    @property
    def text(self) -> str:
        return self.body.decode()

    @property
    def redelivered(self) -> bool:
        """Delivered before without an ack: released, or out when its stream or node went."""
        return self.delivery_count > 1

    async def ack(self, wait: bool = False) -> None:
        """Done with it; `wait` returns only once the server has committed the ack."""
        await self._consumer._settle_many("ack", [self], wait)

    async def release(self, wait: bool = False) -> None:
        """Give it back: it is redelivered first in its group, delivery count + 1.

        The server takes back every later message of the group this consumer holds, so the
        group is redelivered in order: those still buffered here are dropped, and settling
        one already handed out is ignored by the server.
        """
        await self._consumer._settle_many("release", [self], wait)

    async def reject(self, wait: bool = False) -> None:
        """Refuse it: it goes to the dead-letter address (or is dropped)."""
        await self._consumer._settle_many("reject", [self], wait)


class Consumer:
    """Receives from one queue: `async for msg in consumer` (or `await consumer.receive()`).

    A background task reads the stream, so receipts arrive even while nobody iterates; settles
    are queued and a writer task sends everything queued since its last write as one message.
    When the stream drops and the client fails over, the task subscribes again (same queue,
    name and prefetch) where the client moved: the iteration goes on. What was buffered but
    not yet handed out is dropped; like what was handed out and not acked, the node delivers
    it again, redelivered.
    """

    def __init__(self, client: Link, queue: str, name: str, prefetch: int) -> None:
        self.queue = queue
        self.name = name
        self.prefetch = prefetch
        self.consumer_id: str | None = None
        self._client = client
        self._call: aio.StreamStreamCall | None = None
        self._generation = 0  # the client's connection the stream runs on
        self._node = client.target  # the node the stream runs to
        self._stream = 0  # subscriptions so far: deliveries of an earlier one cannot be settled
        self._buffer: deque[Received] = deque()
        self._arrived = asyncio.Event()
        self._outbox: list[tuple[SettleKind, list[int], bool]] = []
        self._outbox_ready = asyncio.Event()
        self._receipts: dict[int, asyncio.Future[None]] = {}
        self._error: PinmqError | None = None
        self._ended = False
        self._resuming = False  # subscribing again after a drop
        self._closing = False
        self._starting = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Subscribe; raises NotFound / InvalidArgument when the server refuses."""
        async with self._starting:
            if self._task is None:
                call = await self._client._with_failover(self._subscribe, repeat_unknown=True)
                self._task = asyncio.create_task(self._run(call))

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        await self.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Received:
        message = await self.receive()
        if message is None:
            raise StopAsyncIteration
        return message

    async def receive(self, timeout: float | None = None) -> Received | None:
        """The next message; None when the stream ended or `timeout` seconds passed. The
        time spent subscribing again after a drop does not count: it waits for that."""
        if self._task is None:
            await self.start()
        while not self._buffer:
            if self._error is not None:
                raise self._error
            if self._ended:
                return None
            self._arrived.clear()
            try:
                async with asyncio.timeout(timeout):  # not wait_for: in 3.11 it can swallow
                    await self._arrived.wait()  # a cancel that comes as the event is set
            except TimeoutError:
                if not self._resuming:
                    return None
        return self._buffer.popleft()

    async def ack_many(self, messages: Iterable[Received], wait: bool = False) -> None:
        """Ack several messages in one request (they are usually batched anyway)."""
        await self._settle_many("ack", messages, wait)

    async def release_many(self, messages: Iterable[Received], wait: bool = False) -> None:
        await self._settle_many("release", messages, wait)

    async def _settle_many(
        self, kind: SettleKind, messages: Iterable[Received], wait: bool
    ) -> None:
        chosen, stale = [], []
        for m in messages:
            if m._settled:
                raise PinmqError(
                    f"delivery {m.delivery_id} is already settled", "FAILED_PRECONDITION"
                )
            m._settled = True
            (chosen if m._stream == self._stream else stale).append(m)
        if stale:
            log.debug(
                "%s of %d message(s) from a dropped stream not sent: they come again",
                kind,
                len(stale),
            )
        receipt = self.settle(kind, [m.delivery_id for m in chosen], wait) if chosen else None
        if kind == "ack":
            self._audit_acked(chosen)
        if kind == "release":
            self._drop_returned(chosen)
        if receipt is not None:
            await receipt
        if stale and wait:
            raise ConnectionLost(
                f"{kind} not sent for {len(stale)} message(s) received before a failover: "
                "the node delivers them again",
                "UNAVAILABLE",
            )

    def settle(
        self, kind: SettleKind, delivery_ids: list[int], wait: bool
    ) -> Awaitable[Any] | None:
        """Queue a settle; with `wait`, returns an awaitable that completes on the receipt."""
        if self._error is not None:
            raise self._error
        if self._call is None or self._closing:
            raise PinmqError("the consumer is not subscribed", "FAILED_PRECONDITION")
        self._outbox.append((kind, delivery_ids, wait))
        self._outbox_ready.set()
        if not wait:
            return None
        loop = asyncio.get_running_loop()
        futures = [self._receipts.setdefault(i, loop.create_future()) for i in delivery_ids]
        return asyncio.gather(*futures)

    def _drop_returned(self, released: Iterable[Received]) -> None:
        """Forget buffered messages the server took back with a release of their group."""
        since: dict[str, int] = {}
        for m in released:
            if m.group_id is not None:
                since[m.group_id] = min(since.get(m.group_id, m.delivery_id), m.delivery_id)
        if not since:
            return
        kept: deque[Received] = deque()
        for m in self._buffer:
            if m.group_id in since and m.delivery_id > since[m.group_id]:
                m._settled = True
            else:
                kept.append(m)
        self._buffer = kept

    async def close(self) -> None:
        """Flush pending settles and unsubscribe; unsettled messages go back to the queue."""
        if self._task is None or self._closing:
            return
        self._closing = True
        self._outbox_ready.set()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await self._task
        except TimeoutError:
            assert self._call is not None
            self._call.cancel()
        self._fail_receipts(PinmqError("the consumer was closed", "CANCELLED"))

    async def _subscribe(self) -> aio.StreamStreamCall:
        """A new Consume stream on the client's connection, subscribed."""
        client = self._client
        generation, node = client.generation, client.target
        call = client._broker.Consume(metadata=client.metadata)
        subscribe = pb.Subscribe(queue=self.queue, consumer_name=self.name, prefetch=self.prefetch)
        try:
            with contextlib.suppress(asyncio.InvalidStateError):  # it ended: the read says why
                await call.write(pb.ConsumeRequest(subscribe=subscribe))
            first = await call.read()
        except grpc.RpcError as err:
            raise from_rpc(err, node) from None
        if first is aio.EOF or first.WhichOneof("kind") != "subscribed":
            call.cancel()
            raise PinmqError("the server ended the subscription at once", "UNKNOWN")
        self.consumer_id = first.subscribed.consumer_id
        self._call, self._generation, self._node = call, generation, node
        return call

    async def _run(self, call: aio.StreamStreamCall) -> None:
        """Serve the stream; after a drop, with failover, subscribe again where the client
        moved, until the consumer closes or the stream ends for good."""
        try:
            while (error := await self._serve(call)) is not None:
                self._stream_ended(error)
                if not self._dropped(error):
                    self._error = error
                    return
                self._resuming = True
                self._forget_stream()
                try:
                    await self._client._move(self._generation)
                    call = await self._client._with_failover(self._subscribe, repeat_unknown=True)
                except PinmqError as err:
                    self._error = err
                    return
                finally:
                    self._resuming = False
                log.info(
                    "consumer %s subscribed to %s again at %s", self.name, self.queue, self._node
                )
        finally:
            self._ended = True
            self._arrived.set()

    async def _serve(self, call: aio.StreamStreamCall) -> PinmqError | None:
        """Read the stream, with a writer task for the settles, until it ends; why it ended
        (None: the consumer closed, or the node ended it without an error)."""
        writer = asyncio.create_task(self._write_loop(call))
        try:
            while (response := await call.read()) is not aio.EOF:
                kind = response.WhichOneof("kind")
                if kind == "deliveries":
                    self._buffer.extend(self._received(d) for d in response.deliveries.deliveries)
                    self._arrived.set()
                elif kind == "settled":
                    for did in response.settled.delivery_ids:
                        future = self._receipts.pop(did, None)
                        if future is not None and not future.done():
                            future.set_result(None)
        except grpc.RpcError as err:
            if not (self._closing and err.code() == grpc.StatusCode.CANCELLED):
                return from_rpc(err, self._node)
        except asyncio.CancelledError:
            error = moved_under("consume stream", self._node)  # raises if this task was cancelled
            if not self._closing:
                return error
        finally:
            writer.cancel()
            await asyncio.wait([writer])
        return None

    def _dropped(self, error: PinmqError) -> bool:
        """Whether the stream ended with its connection (or the node going away), not for a
        reason of the subscription's own such as a deleted queue: failover can resume it."""
        client = self._client
        moved = self._generation != client.generation  # its channel was closed under it
        return client.fails_over and not self._closing and (error.code == "UNAVAILABLE" or moved)

    def _forget_stream(self) -> None:
        """What the dropped stream held is void: its settles, and its buffered messages, which
        the node delivers again."""
        self._stream += 1
        self._outbox.clear()
        self._buffer.clear()

    async def _write_loop(self, call: aio.StreamStreamCall) -> None:
        try:
            while True:
                await self._outbox_ready.wait()
                self._outbox_ready.clear()
                batch, self._outbox = self._outbox, []
                for kind, ids, wait in _coalesce(batch):
                    await call.write(
                        pb.ConsumeRequest(**{kind: pb.Settle(delivery_ids=ids, want_receipt=wait)})
                    )
                if self._closing and not self._outbox:
                    await call.done_writing()
                    return
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass  # the stream ended (InvalidStateError: before this write); the reader says why

    def _audit(self, kind: Kind, m: Received, **extra: Any) -> None:
        audit = self._client.audit
        assert audit is not None
        mid = m.headers.get(MID_HEADER)
        audit.record(
            kind,
            node=self._node,
            msg_id=m.msg_id,
            mid=mid,
            address=m.address,
            queue=m.queue,
            group=m.group_id,
            group_seq=m.group_seq or None,
            producer=mid.rpartition("/")[0] or None if mid else None,
            consumer=self.consumer_id,
            consumer_name=self.name,
            user=self._client.user,
            **extra,
        )

    def _audit_acked(self, messages: Iterable[Received]) -> None:
        if self._client.audit is not None:
            for m in messages:
                self._audit(Kind.CLIENT_ACKED, m)

    def _received(self, d: pb.Delivery) -> Received:
        if self._client.audit is not None:
            received = self._received_plain(d)
            self._audit(Kind.CLIENT_RECEIVED, received, delivery_count=received.delivery_count)
            return received
        return self._received_plain(d)

    def _received_plain(self, d: pb.Delivery) -> Received:
        return Received(
            msg_id=d.msg_id,
            delivery_id=d.delivery_id,
            queue=d.queue,
            address=d.address,
            body=d.body,
            headers={k: d.headers[k] for k in d.headers},
            group_id=d.group_id or None,
            group_seq=d.group_seq,
            delivery_count=d.delivery_count,
            persistent=d.persistent,
            _consumer=self,
            _stream=self._stream,
        )

    def _stream_ended(self, error: PinmqError) -> None:
        """Fail the receipts still awaited when the stream ends, saying what is known.

        A settle still in the outbox never left: it did not happen (the message comes back).
        One that was sent may have been committed before the stream ended.
        """
        unsent = {i for _, ids, _ in self._outbox for i in ids}
        target = self._node
        receipts, self._receipts = self._receipts, {}
        for delivery_id, future in receipts.items():
            if future.done():
                continue
            if delivery_id in unsent:
                future.set_exception(
                    ConnectionLost(
                        f"the consume stream to {target} ended before this settle was sent "
                        f"({error}): it did not happen",
                        error.code,
                    )
                )
            else:
                future.set_exception(
                    OutcomeUnknown(
                        f"the consume stream to {target} ended before the receipt ({error}): "
                        "the settle may have been committed",
                        error.code,
                    )
                )

    def _fail_receipts(self, error: PinmqError) -> None:
        receipts, self._receipts = self._receipts, {}
        for future in receipts.values():
            if not future.done():
                future.set_exception(error)


def _coalesce(
    batch: list[tuple[SettleKind, list[int], bool]],
) -> Iterator[tuple[SettleKind, list[int], bool]]:
    """Merge consecutive settles of the same kind and receipt wish, keeping their order."""
    for (kind, wait), group in itertools.groupby(batch, key=lambda e: (e[0], e[2])):
        yield kind, [i for _, ids, _ in group for i in ids], wait
