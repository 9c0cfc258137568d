"""Store-and-forward: moving messages to the node that holds their target queue, exactly once.

Sender side (`Bridge`, one per peer): messages for a peer wait in the internal durable FIFO
queue `$sf.<cluster>.<peer>`. While the peer is reachable the bridge consumes that queue like
any consumer (a window of `PREFETCH` deliveries through the core, arriving on a
`ConsumerStream`), sends them as `Forward` batches and acks each delivery once the peer says
it holds it durably. When the link drops, the bridge closes its consumer: the core returns
the in-flight messages to the head of the queue in order, and they are sent again later.

Receiver side (`ForwardReceiver`): each forwarded message is enqueued into its named queue
and the per-origin high-water mark is raised in the same store transaction; anything at or
below the mark is a resend and is dropped. Only then is the batch acknowledged. Sequences are
the message ids of the origin's SF queue, which only ever grow, so one number per origin
(and origin store) is the whole deduplication state.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from typing import Protocol

import grpc
from grpc import aio

from broker import channels, logs
from broker.config import ClusterSection, QueueConfig
from broker.core import CoreError
from broker.effects import Delivery
from broker.engine import NotServing
from broker.message import Outgoing
from broker.streams import ConsumerStream
from broker.unit import Placement, Unit
from broker.writes import shielded
from cluster.connector import CHANNEL_OPTIONS
from cluster.local import LocalEngine
from cluster.outage import Outage, raise_if_cancelled
from pinmq_pb import cluster_pb2 as pb
from pinmq_pb import cluster_pb2_grpc as pb_grpc

log = logs.get("cluster")


class Admission(Protocol):
    """Where a forwarded message goes on arrival (`cluster/claims.py`)."""

    def admit(self, queue: str, message: Outgoing, unit: Unit) -> int | None:
        """Enqueue it here with `unit` (its group held if its binding here is unconfirmed);
        its msg id, as `Unit.place`."""
        ...


class BridgeHost(Protocol):
    """What forwarding needs of the cluster member that runs it (`cluster/member.py`)."""

    engine: LocalEngine
    node_id: str
    store_id: int
    config: ClusterSection
    stopping: bool
    admission: Admission | None

    async def reachable(self, node_id: str) -> str: ...

    def bridge_ended(self, bridge: Bridge) -> None: ...

    def dial(self, address: str, options: channels.Options) -> aio.Channel: ...


FORWARD_HEADER = "_pinmq_fwd"  # SF queue: the target queue; at the receiver: "origin:seq"
COUNT_HEADER = "_pinmq_dc"  # SF queue: deliveries a moved message already had (absent: 0)
PREFETCH = 500  # forwarded messages in flight per peer, unacknowledged by it
BATCH_BYTES = 1 << 20  # a ForwardBatch is cut after this many body bytes
SF_PREFIX = "$sf."
# FIFO (grouping off), durable, and never dead-lettered however often a link flaps (the
# attempts limit is the largest the client API can show: ListQueues lists SF queues too).
SF_SETTINGS = QueueConfig(
    durable=True, group_buckets=0, max_delivery_attempts=2**31 - 1, dead_letter_address=None
)


def sf_queue(cluster_name: str, node_id: str) -> str:
    """The store-and-forward queue holding messages on their way to `node_id`."""
    return f"{SF_PREFIX}{cluster_name}.{node_id}"


# ---- receiving ------------------------------------------------------------------------------


class ForwardReceiver:
    """Enqueues forwarded batches into local queues exactly once per origin sequence."""

    def __init__(self, cluster: BridgeHost) -> None:
        self.cluster = cluster
        self._accepted: dict[str, int] = {}  # origin key -> highest seq enqueued (maybe unwritten)
        # origin key -> the latest mark's write, kept once done: an ack of a seq it accepted
        # waits for it, and a write that failed (the node is stopping) acks nothing more.
        self._writes: dict[str, asyncio.Future[None]] = {}
        self.duplicates = 0
        self.dropped = 0

    def load(self, marks: dict[str, int]) -> None:
        self._accepted = dict(marks)

    def receive(self, batch: pb.ForwardBatch) -> tuple[int, asyncio.Future[None] | None]:
        """Enqueue a batch now; returns the seq to acknowledge and the write to await first.

        A seq counts as accepted as soon as it is enqueued, before its write is done, so that
        batches can follow each other; a batch of seqs already accepted (the bridge's resend
        after a broken stream) is acknowledged once the write that accepted them is done, and
        never if it failed: a write refused while this process stops (it lost its node) left
        the messages in the core only, and a resend taken as their duplicate was lost. A
        failed write fails the engine, so every later write fails too: a new batch's ack,
        which waits for its own write, never covers an earlier batch that did not reach the
        disk. Each call returns a view of the write of its own: a stream cancelled while it
        waits (its origin was killed) cancels its view, never the write a resend waits for.
        """
        key = f"{batch.origin}/{batch.origin_store}"
        mark = top = self._accepted.get(key, 0)
        admission = self.cluster.admission
        with self.cluster.engine.unit() as unit:
            for m in batch.messages:
                if m.seq <= top:
                    self.duplicates += 1
                    continue
                top = m.seq
                self._enqueue(batch.origin, m, admission, unit)
            if top != mark:
                unit.mark(key, top)
        if top == mark:
            kept = self._writes.get(key)  # None: the mark came from the store
            return mark, None if kept is None else shielded(kept)
        self._accepted[key] = top
        # One write for the messages and the mark, like any send's, so the messages are
        # audited (`sent` here) and gate their deliveries the same way.
        write = unit.write
        assert write is not None  # a mark is always written
        self._writes[key] = write
        return top, shielded(write)

    def _enqueue(
        self, origin: str, m: pb.ForwardedMessage, admission: Admission | None, unit: Unit
    ) -> None:
        headers = {k: m.headers[k] for k in m.headers}
        headers[FORWARD_HEADER] = f"{origin}:{m.seq}"
        count = _count(headers.pop(COUNT_HEADER, None))
        message = Outgoing(m.address, m.body, headers, m.persistent, count)
        try:
            if m.queue.startswith(SF_PREFIX):  # would forward it on: max-hops is 1
                raise CoreError(f"{m.queue!r} is an internal queue")
            if admission is None:
                msg_id = unit.place(Placement(m.queue, message))
            else:
                msg_id = admission.admit(m.queue, message, unit)
        except CoreError as err:
            self.dropped += 1
            log.error("forwarded message dropped", origin=origin, seq=m.seq, error=str(err))
            return
        if msg_id is None:
            self.dropped += 1
            log.warning(
                "forwarded message dropped: no queue and no dead-letter address",
                origin=origin,
                seq=m.seq,
                queue=m.queue,
            )

    async def serve(self, context: aio.ServicerContext) -> None:
        """One Forward stream: batches are enqueued as they arrive, acks follow their writes."""
        me = self.cluster.node_id
        acks: asyncio.Queue[tuple[int, asyncio.Future[None] | None] | None] = asyncio.Queue()

        async def take() -> None:
            try:
                while (batch := await context.read()) is not aio.EOF:
                    if batch.target_node != me:
                        raise _Misrouted(
                            f"forward batch for node {batch.target_node!r} reached node {me!r}"
                        )
                    acks.put_nowait(self.receive(batch))
            finally:
                acks.put_nowait(None)

        reader = asyncio.create_task(take())
        try:
            while (item := await acks.get()) is not None:
                seq, write = item
                if write is not None:
                    await write
                await context.write(pb.ForwardAck(seq=seq))
            await reader  # raises what ended the reading
        except _Misrouted as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        except NotServing as err:  # the node is stopping: the bridge tries again, elsewhere
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        finally:
            reader.cancel()


class _Misrouted(Exception):
    pass


def _count(raw: str | None) -> int:
    try:
        return max(0, int(raw)) if raw else 0
    except ValueError:
        return 0


# ---- sending --------------------------------------------------------------------------------


class _QueueGone(Exception):
    """The SF queue was deleted (by an operator): the bridge ends until the next forward."""


class Bridge:
    """Drains one peer's SF queue to that peer whenever it is reachable."""

    def __init__(self, cluster: BridgeHost, peer: str) -> None:
        self.cluster = cluster
        self.peer = peer
        self.queue = sf_queue(cluster.config.name, peer)
        self.sent = 0
        self.acked = 0
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"bridge:{self.peer}")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def _run(self) -> None:
        cluster = self.cluster
        interval = cluster.config.reconnect_interval / 1000
        outage = Outage()  # a long outage logs each of its failures once
        try:
            while True:
                address = await cluster.reachable(self.peer)
                acked = self.acked
                try:
                    await self._session(address)
                    reason = "the peer ended the forward stream"
                except grpc.RpcError as err:
                    code = err.code()
                    reason = f"{code.name if code else 'UNKNOWN'}: {err.details()}"
                except ConnectionError as err:
                    reason = str(err)
                except _QueueGone:
                    raise
                except Exception as err:  # a bug must not end forwarding for good
                    log.exception("bridge failed", peer=self.peer)
                    reason = repr(err)
                raise_if_cancelled()  # the bridge stops: grpcio may have called that a failure
                if self.acked != acked:
                    outage.over()  # it forwarded: its next failure is news again
                if outage.news(reason) and not cluster.stopping:
                    log.info("bridge down", peer=self.peer, address=address, reason=reason)
                await asyncio.sleep(interval)
        except _QueueGone:
            log.info("bridge ended: its queue was deleted", peer=self.peer, queue=self.queue)
        finally:
            cluster.bridge_ended(self)

    async def _session(self, address: str) -> None:
        engine = self.cluster.engine
        consumer_id = f"bridge-{uuid.uuid4().hex[:12]}"
        inflight: deque[tuple[int, int]] = deque()  # (seq, delivery id), in delivery order
        async with self.cluster.dial(address, CHANNEL_OPTIONS) as channel:
            call = pb_grpc.ClusterStub(channel).Forward()
            try:
                with engine.unit() as unit:
                    name = f"bridge to {self.peer}"
                    stream = unit.subscribe(self.queue, consumer_id, name, PREFETCH)
            except CoreError:
                call.cancel()
                raise _QueueGone from None
            tasks: list[asyncio.Task[None]] = []
            try:
                tasks = [
                    asyncio.create_task(self._send(call, stream, inflight)),
                    asyncio.create_task(self._receive(call, stream, inflight)),
                ]
                await asyncio.wait([*tasks, stream.ended], return_when=asyncio.FIRST_COMPLETED)
                if stream.ended.done():
                    code, _ = stream.ended.result()
                    if code == "NOT_FOUND":
                        raise _QueueGone
                    raise ConnectionError("the node is shutting down")
                for task in tasks:
                    if task.done():
                        task.result()
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                call.cancel()
                with engine.unit() as unit:  # in-flight messages go back to the head, in order
                    unit.unsubscribe(stream)

    async def _send(
        self, call: aio.StreamStreamCall, stream: ConsumerStream, inflight: deque[tuple[int, int]]
    ) -> None:
        outbound = stream.outbound
        while True:
            items = [await outbound.get()]
            while not outbound.empty():
                items.append(outbound.get_nowait())
            batch = self._batch()
            size = 0
            for item in items:
                if not isinstance(item, list):
                    continue  # a receipt: the bridge never asks for one
                for d in item:
                    if size >= BATCH_BYTES:
                        await call.write(batch)
                        batch, size = self._batch(), 0
                    self._add(batch, d)
                    inflight.append((d.message.msg_id, d.delivery_id))
                    size += len(d.message.body)
            if batch.messages:
                await call.write(batch)

    def _batch(self) -> pb.ForwardBatch:
        cluster = self.cluster
        return pb.ForwardBatch(
            origin=cluster.node_id, origin_store=cluster.store_id, target_node=self.peer
        )

    def _add(self, batch: pb.ForwardBatch, d: Delivery) -> None:
        m = d.message
        headers = dict(m.headers)
        target = headers.pop(FORWARD_HEADER, m.address)
        batch.messages.add(
            seq=m.msg_id,
            queue=target,
            address=m.address,
            body=m.body,
            headers=headers,
            persistent=m.persistent,
        )
        self.sent += 1

    async def _receive(
        self, call: aio.StreamStreamCall, stream: ConsumerStream, inflight: deque[tuple[int, int]]
    ) -> None:
        engine = self.cluster.engine
        while (ack := await call.read()) is not aio.EOF:
            ids = []
            while inflight and inflight[0][0] <= ack.seq:
                ids.append(inflight.popleft()[1])
            if ids:
                self.acked += len(ids)
                try:
                    with engine.unit() as unit:
                        unit.settle(stream, "ack", ids)
                except CoreError:
                    raise _QueueGone from None
        raise ConnectionError("the peer ended the forward stream")
