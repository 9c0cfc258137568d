"""The Python client of pinmq: producers, consumers and queue administration over gRPC.

Everything is batched on the wire: `Producer.send_many` pipelines batches on one stream,
a consumer receives every ready delivery in one message, and acks made between two reads
go out together in one Settle. `SyncClient` is a small blocking facade for scripts.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import grpc
from grpc import aio

from broker.audit import MID_HEADER, AuditLog
from broker.message import GROUP_ID_HEADER, GROUP_SEQ_HEADER
from pinmq_pb import client_pb2 as pb
from pinmq_pb import client_pb2_grpc as pb_grpc

Body = bytes | str
Item = Body | tuple[Body, Mapping[str, str]]
SettleKind = Literal["ack", "release", "reject"]
T = TypeVar("T")

DEFAULT_URL = "127.0.0.1:7601"
CONNECT_TIMEOUT_S = 5.0
BATCH_BYTES = 1 << 20  # a send_many batch is cut at this size, below the server's frame limit
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]
_NULLABLE = ("group_first_key", "default_group", "dead_letter_address")


# ---- errors ---------------------------------------------------------------------------------


class PinmqError(Exception):
    """Any failure reported by pinmq; `code` is the gRPC status name (e.g. "NOT_FOUND")."""

    def __init__(self, message: str, code: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.code = code


class NotFound(PinmqError):
    """The queue, address or group does not exist."""


class InvalidArgument(PinmqError):
    """The request was refused as invalid (bad settings, oversized message, ...)."""


class AlreadyExists(PinmqError):
    """A queue of that name exists already."""


class Unavailable(PinmqError):
    """No node could be reached, or the connection was lost."""


_BY_CODE: dict[str, type[PinmqError]] = {
    "NOT_FOUND": NotFound,
    "INVALID_ARGUMENT": InvalidArgument,
    "ALREADY_EXISTS": AlreadyExists,
    "UNAVAILABLE": Unavailable,
}


def _error(code: str, message: str) -> PinmqError:
    return _BY_CODE.get(code, PinmqError)(message, code)


REFUSED_METADATA = ("pinmq-refused", "1")  # the node answered: its refusal, not a lost link


def _from_rpc(err: grpc.RpcError, target: str) -> PinmqError:
    code = err.code()
    name = code.name if code is not None else "UNKNOWN"
    details = err.details() or name
    if name == "UNAVAILABLE" and REFUSED_METADATA not in tuple(err.trailing_metadata() or ()):
        details = f"lost or no connection to {target}: {details}"
    return _error(name, details)


# ---- data -----------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class QueueInfo:
    name: str
    address: str
    depth: int
    consumer_count: int
    settings: dict[str, Any]


@dataclass(slots=True, frozen=True)
class GroupInfo:
    group: str
    owner: str | None
    owner_name: str | None
    pending: int
    outstanding: int
    last_use: datetime | None


@dataclass(slots=True, frozen=True)
class ClusterGroupInfo:
    """A group on one queue instance (`queue@node`), as `Client.cluster_groups` lists it."""

    group: str
    queue: str
    node: str
    bound: bool  # the LOCAL grouping handler binds (group, queue) to this node
    owner: str | None
    owner_name: str | None
    pending: int
    outstanding: int
    last_use: datetime | None


@dataclass(slots=True, frozen=True)
class ClusterGroups:
    groups: list[ClusterGroupInfo]
    unreachable: list[str]  # nodes (or the grouping handler) that did not answer
    problems: list[str]


@dataclass(slots=True, frozen=True)
class ClusterStatus:
    node_id: str
    connected: dict[str, bool]  # node id -> linked now (this node included)
    handlers: dict[str, str]  # node id -> "LOCAL", "REMOTE" or ""
    problems: list[str]
    consumers: dict[str, dict[str, int]]  # node id -> queue -> consumers, as this node sees it


def _time(unix_ms: int) -> datetime | None:
    return datetime.fromtimestamp(unix_ms / 1000, UTC) if unix_ms else None


@dataclass(slots=True, eq=False)
class Received:
    """A delivered message; settle it exactly once with ack, release or reject."""

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
    _settled: bool = field(default=False, repr=False)

    @property
    def text(self) -> str:
        return self.body.decode()

    async def ack(self, wait: bool = False) -> None:
        """Done with it; `wait` returns only once the server has committed the ack."""
        await self._settle("ack", wait)

    async def release(self, wait: bool = False) -> None:
        """Give it back: it is redelivered first in its group, delivery count + 1.

        The server takes back every later message of the group this consumer holds, so the
        group is redelivered in order: those still buffered here are dropped, and settling
        one already handed out is ignored by the server.
        """
        await self._settle("release", wait)

    async def reject(self, wait: bool = False) -> None:
        """Refuse it: it goes to the dead-letter address (or is dropped)."""
        await self._settle("reject", wait)

    async def _settle(self, kind: SettleKind, wait: bool) -> None:
        if self._settled:
            raise PinmqError(
                f"delivery {self.delivery_id} is already settled", "FAILED_PRECONDITION"
            )
        self._settled = True
        receipt = self._consumer.settle(kind, [self.delivery_id], wait)
        if kind == "ack":
            self._consumer._audit_acked((self,))
        if kind == "release":
            self._consumer._drop_returned([self])
        if receipt is not None:
            await receipt


# ---- client ---------------------------------------------------------------------------------


class Client:
    """A connection to one pinmq node: the first reachable address of `url`.

    `url` is "host:port[,host:port...]". Use as `async with Client(url) as client:`.
    With `audit` (a directory, or an `AuditLog`), the client records `client_sent` (once the
    node confirmed the send), `client_received` and `client_acked` events for `pinmq check`,
    and tags every message it sends with a `pinmq-mid` header (producer id / sequence).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        audit: str | Path | AuditLog | None = None,
        audit_name: str | None = None,
    ):
        self.addresses = [a.strip() for a in url.split(",") if a.strip()]
        if not self.addresses:
            raise InvalidArgument(f"no address in url {url!r}", "INVALID_ARGUMENT")
        self.target = self.addresses[0]
        self._connect_timeout = connect_timeout
        self._channel: aio.Channel | None = None
        self._broker: pb_grpc.BrokerStub
        self._admin: pb_grpc.AdminStub
        # Audit log (broker/audit.py): opened on connect when given a directory.
        self.audit: AuditLog | None = audit if isinstance(audit, AuditLog) else None
        self._audit_dir = None if audit is None or isinstance(audit, AuditLog) else Path(audit)
        self._audit_name = audit_name or f"client-{uuid.uuid4().hex[:8]}"
        self._producers = itertools.count(1)

    async def connect(self) -> None:
        """Open a channel to the first address that answers within the connect timeout."""
        failures = []
        for target in self.addresses:
            channel = aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
            if not await _ready(channel, self._connect_timeout):
                await channel.close()
                failures.append(target)
                continue
            self.target, self._channel = target, channel
            self._broker = pb_grpc.BrokerStub(channel)
            self._admin = pb_grpc.AdminStub(channel)
            if self._audit_dir is not None and self.audit is None:
                self.audit = AuditLog(self._audit_dir, self._audit_name, node=target).start()
            return
        raise Unavailable(
            f"cannot reach a pinmq node at {', '.join(failures)} (connection refused or timed out)",
            "UNAVAILABLE",
        )

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        if self._audit_dir is not None and self.audit is not None:
            self.audit.close()
            self.audit = None

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _call(self, rpc: Awaitable[T]) -> T:
        try:
            return await rpc
        except grpc.RpcError as err:
            raise _from_rpc(err, self.target) from None

    # ---- producing and consuming ----

    def producer(
        self,
        address: str,
        *,
        group_id: str | None = None,
        auto_group: bool = False,
        group_header: str = GROUP_ID_HEADER,
        persistent: bool = True,
    ) -> Producer:
        """A producer; with `group_id` or `auto_group` every message joins that one group."""
        if group_id is not None and auto_group:
            raise InvalidArgument("give group_id or auto_group, not both", "INVALID_ARGUMENT")
        group = str(uuid.uuid4()) if auto_group else group_id
        producer = Producer(self, address, group, group_header, persistent)
        if self.audit is not None:
            producer.producer_id = f"{self._audit_name}.p{next(self._producers)}"
        return producer

    def consumer(self, queue: str, *, name: str | None = None, prefetch: int = 100) -> Consumer:
        """A consumer of `queue`; it subscribes on first use (iteration or `start()`)."""
        return Consumer(self, queue, name or f"py-{uuid.uuid4().hex[:8]}", prefetch)

    # ---- administration ----

    async def create_queue(
        self, queue: str, *, address: str | None = None, **settings: Any
    ) -> None:
        """Create `queue` on `address` (default: same name); settings as in the node config."""
        request = pb.CreateQueueRequest(
            address=address or queue, queue=queue, settings=_settings_pb(settings)
        )
        await self._call(self._admin.CreateQueue(request))

    async def delete_queue(self, queue: str) -> int:
        """Delete `queue` and its messages; returns how many messages were removed."""
        reply = await self._call(self._admin.DeleteQueue(pb.DeleteQueueRequest(queue=queue)))
        return reply.removed_messages

    async def queues(self) -> list[QueueInfo]:
        reply = await self._call(self._admin.ListQueues(pb.ListQueuesRequest()))
        return [
            QueueInfo(q.name, q.address, q.depth, q.consumer_count, _settings_dict(q.settings))
            for q in reply.queues
        ]

    async def groups(self, queue: str) -> list[GroupInfo]:
        reply = await self._call(self._admin.ListGroups(pb.ListGroupsRequest(queue=queue)))
        return [
            GroupInfo(
                group=g.group,
                owner=g.owner_consumer_id or None,
                owner_name=g.owner_name or None,
                pending=g.pending,
                outstanding=g.outstanding,
                last_use=_time(g.last_use_unix_ms),
            )
            for g in reply.groups
        ]

    async def reset_groups(self, queue: str, group: str | None = None) -> None:
        """Unpin one group (or all): their next messages may go to any consumer."""
        request = pb.ResetGroupsRequest(queue=queue, group=group)
        await self._call(self._admin.ResetGroups(request))

    # ---- the cluster (clustered nodes only) ----

    async def cluster_groups(
        self, queue: str | None = None, *, group: str | None = None
    ) -> ClusterGroups:
        """Every group of the cluster (of one queue, one group) in one call, from any node."""
        request = pb.ClusterGroupsRequest(queue=queue or "", group=group or "")
        reply = await self._call(self._admin.ClusterGroups(request))
        return ClusterGroups(
            groups=[
                ClusterGroupInfo(
                    group=g.group,
                    queue=g.queue,
                    node=g.node,
                    bound=g.bound,
                    owner=g.owner_consumer_id or None,
                    owner_name=g.owner_name or None,
                    pending=g.pending,
                    outstanding=g.outstanding,
                    last_use=_time(g.last_use_unix_ms),
                )
                for g in reply.groups
            ],
            unreachable=list(reply.unreachable),
            problems=list(reply.problems),
        )

    async def cluster_reset_group(self, group: str, queue: str | None = None) -> int:
        """Unbind a group cluster-wide (on one queue, or every queue); every node unpins it.

        Returns how many bindings were removed.
        """
        request = pb.ClusterResetGroupRequest(group=group, queue=queue)
        reply = await self._call(self._admin.ClusterResetGroup(request))
        return reply.removed

    async def cluster_status(self) -> ClusterStatus:
        reply = await self._call(self._admin.ClusterStatus(pb.ClusterStatusRequest()))
        return ClusterStatus(
            node_id=reply.node_id,
            connected={n.node_id: n.connected for n in reply.nodes},
            handlers={n.node_id: n.handler for n in reply.nodes},
            problems=list(reply.problems),
            consumers={n.node_id: dict(n.consumers) for n in reply.nodes},
        )


async def _ready(channel: aio.Channel, timeout: float) -> bool:
    """Wait until the channel connects; False at once on a refused connection, or on timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    state = channel.get_state(try_to_connect=True)
    while state != grpc.ChannelConnectivity.READY:
        remaining = deadline - loop.time()
        if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE or remaining <= 0:
            return False
        try:
            await asyncio.wait_for(channel.wait_for_state_change(state), remaining)
        except TimeoutError:
            return False
        state = channel.get_state(try_to_connect=True)
    return True


def _settings_pb(settings: Mapping[str, Any]) -> pb.QueueSettings:
    values = {}
    for key, value in settings.items():
        name = key.replace("-", "_")
        if name not in pb.QueueSettings.DESCRIPTOR.fields_by_name:
            raise InvalidArgument(f"unknown queue setting {key!r}", "INVALID_ARGUMENT")
        values[name] = "" if value is None and name in _NULLABLE else value
    try:
        return pb.QueueSettings(**values)
    except (TypeError, ValueError) as err:
        raise InvalidArgument(f"bad queue setting: {err}", "INVALID_ARGUMENT") from None


def _settings_dict(settings: pb.QueueSettings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for desc in settings.DESCRIPTOR.fields:
        if settings.HasField(desc.name):
            value = getattr(settings, desc.name)
            out[desc.name] = None if desc.name in _NULLABLE and value == "" else value
    return out


# ---- producer -------------------------------------------------------------------------------


class Producer:
    """Sends to one address; when grouped, numbers its messages with JMSXGroupSeq 1, 2, 3..."""

    def __init__(
        self,
        client: Client,
        address: str,
        group_id: str | None,
        group_header: str,
        persistent: bool,
    ) -> None:
        self.address = address
        self.group_id = group_id
        self.group_header = group_header
        self.persistent = persistent
        self._client = client
        self._seq = itertools.count(1)
        self.producer_id: str | None = None  # set when the client audits: mids are <id>/<n>
        self._mids = itertools.count(1)

    def _message(self, body: Body, headers: Mapping[str, str] | None) -> pb.Message:
        hdrs = dict(headers) if headers else {}
        if self.group_id is not None:
            hdrs[self.group_header] = self.group_id
            hdrs[GROUP_SEQ_HEADER] = str(next(self._seq))
        if self.producer_id is not None:
            hdrs[MID_HEADER] = f"{self.producer_id}/{next(self._mids)}"
        data = body.encode() if isinstance(body, str) else body
        return pb.Message(address=self.address, body=data, headers=hdrs, persistent=self.persistent)

    def _item(self, item: Item) -> pb.Message:
        if isinstance(item, tuple):
            return self._message(item[0], item[1])
        return self._message(item, None)

    async def send(self, body: Body, headers: Mapping[str, str] | None = None) -> int:
        """Send one message; returns its id once the node has it (on disk if persistent)."""
        request = pb.SendRequest(message=self._message(body, headers))
        reply = await self._client._call(self._client._broker.Send(request))
        self._audit_sent((request.message,), (reply.msg_id,))
        return reply.msg_id

    async def send_batch(self, items: Sequence[Item]) -> list[int]:
        """Send several messages in one request: all are accepted or none."""
        request = pb.SendBatchRequest(messages=[self._item(i) for i in items])
        reply = await self._client._call(self._client._broker.SendBatch(request))
        self._audit_sent(request.messages, reply.msg_ids)
        return list(reply.msg_ids)

    def _audit_sent(self, messages: Sequence[pb.Message], ids: Sequence[int]) -> None:
        """`client_sent` for messages the node confirmed (audit log only)."""
        audit = self._client.audit
        if audit is None or self.producer_id is None:
            return
        group = self.group_id
        for m, msg_id in zip(messages, ids, strict=False):
            seq = m.headers.get(GROUP_SEQ_HEADER)
            audit.record(
                "client_sent",
                msg_id=msg_id,
                mid=m.headers.get(MID_HEADER),
                address=m.address,
                group=group,
                group_seq=int(seq) if seq else None,
                producer=self.producer_id,
            )

    async def send_many(
        self,
        items: Iterable[Item],
        *,
        batch_size: int = 500,
        window: int = 8,
        on_sent: Callable[[int], None] | None = None,
    ) -> list[int]:
        """Stream many messages, `window` batches in flight; returns the ids in order.

        `on_sent(n)` is called as each batch of n messages is confirmed. On the first failed
        batch this raises; the batches confirmed before it are enqueued.
        """
        call = self._client._broker.SendStream()
        credit = asyncio.Semaphore(window)
        ids: list[int] = []
        failure: list[BaseException] = []
        in_flight: deque[list[pb.Message]] = deque()  # batches awaiting results (audit log)
        auditing = self._client.audit is not None and self.producer_id is not None

        async def read_results() -> None:
            try:
                async for result in call:
                    if result.error_code:
                        raise _error(result.error_code, result.error_message)
                    ids.extend(result.msg_ids)
                    if auditing:
                        self._audit_sent(in_flight.popleft(), result.msg_ids)
                    if on_sent is not None:
                        on_sent(len(result.msg_ids))
                    credit.release()
            except grpc.RpcError as err:
                failure.append(_from_rpc(err, self._client.target))
            except PinmqError as err:
                failure.append(err)
            if failure:
                for _ in range(window):  # unblock the writer so it sees the failure
                    credit.release()

        reader = asyncio.create_task(read_results())
        try:
            for batch in self._batches(items, batch_size):
                await credit.acquire()
                if failure:
                    break
                if auditing:
                    in_flight.append(batch)
                await call.write(pb.SendBatchRequest(messages=batch))
            if not failure:
                await call.done_writing()
            await reader
        except grpc.RpcError as err:
            await reader
            if not failure:
                failure.append(_from_rpc(err, self._client.target))
        finally:
            if not reader.done():
                reader.cancel()
            call.cancel()
        if failure:
            raise failure[0]
        return ids

    def _batches(self, items: Iterable[Item], batch_size: int) -> Iterator[list[pb.Message]]:
        batch: list[pb.Message] = []
        size = 0
        for item in items:
            message = self._item(item)
            batch.append(message)
            size += len(message.body)
            if len(batch) >= batch_size or size >= BATCH_BYTES:
                yield batch
                batch, size = [], 0
        if batch:
            yield batch


# ---- consumer -------------------------------------------------------------------------------


class Consumer:
    """Receives from one queue: `async for msg in consumer` (or `await consumer.receive()`).

    A background task reads the stream, so receipts arrive even while nobody iterates; settles
    are queued and a writer task sends everything queued since its last write as one message.
    """

    def __init__(self, client: Client, queue: str, name: str, prefetch: int) -> None:
        self.queue = queue
        self.name = name
        self.prefetch = prefetch
        self.consumer_id: str | None = None
        self._client = client
        self._call: aio.StreamStreamCall | None = None
        self._buffer: deque[Received] = deque()
        self._arrived = asyncio.Event()
        self._outbox: list[tuple[SettleKind, list[int], bool]] = []
        self._outbox_ready = asyncio.Event()
        self._receipts: dict[int, asyncio.Future[None]] = {}
        self._error: PinmqError | None = None
        self._ended = False
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Subscribe; raises NotFound / InvalidArgument when the server refuses."""
        if self._call is not None:
            return
        self._call = call = self._client._broker.Consume()
        subscribe = pb.Subscribe(queue=self.queue, consumer_name=self.name, prefetch=self.prefetch)
        try:
            await call.write(pb.ConsumeRequest(subscribe=subscribe))
            first = await call.read()
        except grpc.RpcError as err:
            raise _from_rpc(err, self._client.target) from None
        if first is aio.EOF or first.WhichOneof("kind") != "subscribed":
            call.cancel()
            raise PinmqError("the server ended the subscription at once", "UNKNOWN")
        self.consumer_id = first.subscribed.consumer_id
        self._tasks = [
            asyncio.create_task(self._read_loop(call)),
            asyncio.create_task(self._write_loop(call)),
        ]

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
        """The next message; None when the stream ended or `timeout` seconds passed."""
        await self.start()
        while not self._buffer:
            if self._error is not None:
                raise self._error
            if self._ended:
                return None
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout)
            except TimeoutError:
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
        ids, chosen = [], []
        for m in messages:
            if m._settled:
                raise PinmqError(
                    f"delivery {m.delivery_id} is already settled", "FAILED_PRECONDITION"
                )
            m._settled = True
            ids.append(m.delivery_id)
            chosen.append(m)
        receipt = self.settle(kind, ids, wait)
        if kind == "ack":
            self._audit_acked(chosen)
        if kind == "release":
            self._drop_returned(chosen)
        if receipt is not None:
            await receipt

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
        if self._call is None or self._closing:
            return
        self._closing = True
        self._outbox_ready.set()
        reader, writer = self._tasks
        await writer
        try:
            await asyncio.wait_for(reader, CONNECT_TIMEOUT_S)
        except TimeoutError:
            self._call.cancel()
        self._fail_receipts(PinmqError("the consumer was closed", "CANCELLED"))

    async def _read_loop(self, call: aio.StreamStreamCall) -> None:
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
                self._error = _from_rpc(err, self._client.target)
                self._fail_receipts(self._error)
        finally:
            self._ended = True
            self._arrived.set()
            self._outbox_ready.set()

    async def _write_loop(self, call: aio.StreamStreamCall) -> None:
        try:
            while True:
                await self._outbox_ready.wait()
                self._outbox_ready.clear()
                if self._ended:
                    return
                batch, self._outbox = self._outbox, []
                for kind, ids, wait in _coalesce(batch):
                    await call.write(
                        pb.ConsumeRequest(**{kind: pb.Settle(delivery_ids=ids, want_receipt=wait)})
                    )
                if self._closing and not self._outbox:
                    await call.done_writing()
                    return
        except grpc.RpcError:
            pass  # the read loop reports the stream's status

    def _audit(self, kind: str, m: Received, **extra: Any) -> None:
        audit = self._client.audit
        assert audit is not None
        mid = m.headers.get(MID_HEADER)
        audit.record(
            kind,
            msg_id=m.msg_id,
            mid=mid,
            address=m.address,
            queue=m.queue,
            group=m.group_id,
            group_seq=m.group_seq or None,
            producer=mid.rpartition("/")[0] or None if mid else None,
            consumer=self.consumer_id,
            consumer_name=self.name,
            **extra,
        )

    def _audit_acked(self, messages: Iterable[Received]) -> None:
        if self._client.audit is not None:
            for m in messages:
                self._audit("client_acked", m)

    def _received(self, d: pb.Delivery) -> Received:
        if self._client.audit is not None:
            received = self._received_plain(d)
            self._audit("client_received", received, delivery_count=received.delivery_count)
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


# ---- blocking facade ------------------------------------------------------------------------


class SyncClient:
    """Blocking wrapper for scripts: a Client on an event loop in a background thread."""

    def __init__(self, url: str = DEFAULT_URL) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._client = Client(url)
        self._producers: dict[tuple[str, str | None, bool], Producer] = {}
        try:
            self._run(self._client.connect())
        except BaseException:
            self.close()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def send(
        self,
        address: str,
        body: Body,
        *,
        group_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        persistent: bool = True,
    ) -> int:
        """Send one message; successive sends to one group get JMSXGroupSeq 1, 2, 3..."""
        key = (address, group_id, persistent)
        producer = self._producers.get(key)
        if producer is None:
            producer = self._producers[key] = self._client.producer(
                address, group_id=group_id, persistent=persistent
            )
        return self._run(producer.send(body, headers))

    def consume(
        self, queue: str, n: int, *, timeout: float = 5.0, prefetch: int = 100
    ) -> list[Received]:
        """Receive and ack up to `n` messages; stops early after `timeout` s without one."""

        async def take() -> list[Received]:
            async with self._client.consumer(queue, prefetch=min(prefetch, n)) as consumer:
                got: list[Received] = []
                while len(got) < n and (m := await consumer.receive(timeout)) is not None:
                    got.append(m)
                if got:
                    await consumer.ack_many(got, wait=True)
                return got

        return self._run(take())

    def queues(self) -> list[QueueInfo]:
        return self._run(self._client.queues())

    def groups(self, queue: str) -> list[GroupInfo]:
        return self._run(self._client.groups(queue))

    def create_queue(self, queue: str, *, address: str | None = None, **settings: Any) -> None:
        self._run(self._client.create_queue(queue, address=address, **settings))

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self._client.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.close()
