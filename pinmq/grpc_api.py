"""The client-facing gRPC shell: translates `pinmq.client.v1` calls to core calls and back.

Handlers validate, call the core synchronously, hand the Effects to the node and await only the
store write that confirms the request. Consumer streams are written by one task per consumer
that packs everything queued for it into as few messages as possible.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, NoReturn

import grpc
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from pydantic import ValidationError

from broker import channels, logs
from broker.admin import ClusterAdmin
from broker.clock import now_ns
from broker.config import QueueConfig
from broker.core import CoreError
from broker.effects import Delivery
from broker.engine import ConsumerStream, Engine, NotServing, Receipt
from broker.sending import Outgoing, SendPath
from broker.store import StoreError
from broker.validation import InvalidInput, check_headers, check_size
from pinmq.grpc_decode import refuse_undecodable, register
from pinmq_pb import client_pb2 as pb
from pinmq_pb import client_pb2_grpc as pb_grpc

log = logs.get("grpc")

PACK_BYTES = 1 << 20  # a Deliveries message is cut after this many body bytes
FRAME_SLACK = 1 << 20  # gRPC receive limit = max-message-size + this (batches, headers)
_NULLABLE = frozenset(("group_first_key", "default_group", "dead_letter_address"))
_SETTINGS_FIELDS = tuple(f.name for f in pb.QueueSettings.DESCRIPTOR.fields)
_SERVICES = ("pinmq.client.v1.Broker", "pinmq.client.v1.Admin")
NODE_REFUSED = ("pinmq-refused", "1")  # trailing metadata: the node itself refused the call
OWED_RECEIPTS_S = 2.0  # how long an ending consume stream waits to send the receipts it owes


class _Refused(Exception):
    """A request refused before it reached the core."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _status(err: CoreError) -> grpc.StatusCode:
    return grpc.StatusCode[err.code.upper()]


async def _refuse(context: aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    """End the call with the node's refusal. Its metadata lets a client tell a refusal, even
    an UNAVAILABLE one (no grouping decision, a failed store write), from a lost connection."""
    await context.abort(code, message, trailing_metadata=(NODE_REFUSED,))


async def _abort(context: aio.ServicerContext, err: Exception) -> NoReturn:
    """End the call with the status that `err` stands for; unexpected errors propagate."""
    if isinstance(err, _Refused):
        await _refuse(context, err.code, str(err))
    if isinstance(err, CoreError):
        await _refuse(context, _status(err), str(err))
    if isinstance(err, StoreError):
        await _refuse(context, grpc.StatusCode.UNAVAILABLE, f"store write failed: {err}")
    if isinstance(err, MemoryError):
        await _refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED, "the node is out of memory")
    if isinstance(err, NotServing):
        await _gone(context, err)
    raise err


async def _gone(context: aio.ServicerContext, err: NotServing) -> NoReturn:
    """An ha pair process that stopped holding its node: not a refusal (no metadata), so a
    client with the pair's other address goes there, sending again what was not confirmed."""
    await context.abort(grpc.StatusCode.UNAVAILABLE, f"{err}: its pair's other process serves")


def make_server(
    engine: Engine, sending: SendPath, admin: ClusterAdmin | None
) -> tuple[aio.Server, health.aio.HealthServicer]:
    """A gRPC server with the Broker, Admin and health services, bound to listen.client."""
    limit = engine.config.limits.max_message_size
    server = aio.server(
        options=[
            ("grpc.max_receive_message_length", limit + FRAME_SLACK),
            ("grpc.so_reuseport", 0),  # a second node on the same port must fail, not share
            *channels.serve_keepalive(),  # a frozen client is noticed, its deliveries go back
        ]
    )
    register(pb_grpc.add_BrokerServicer_to_server, BrokerService(engine, sending), server)
    register(pb_grpc.add_AdminServicer_to_server, AdminService(engine, admin), server)
    health_service = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_service, server)
    address = engine.config.listen.client
    try:
        server.add_insecure_port(address)
    except RuntimeError:
        raise OSError(f"cannot listen on {address} (in use or not a local address)") from None
    return server, health_service


async def mark_serving(health_service: health.aio.HealthServicer) -> None:
    """Report SERVING for the server as a whole and for each pinmq service."""
    for service in ("", *_SERVICES):
        await health_service.set(service, health_pb2.HealthCheckResponse.SERVING)


# ---- producing and consuming ------------------------------------------------------------------


class BrokerService(pb_grpc.BrokerServicer):
    def __init__(self, engine: Engine, sending: SendPath) -> None:
        self.engine = engine
        self.sending = sending
        self.max_size = engine.config.limits.max_message_size
        self.max_batch = engine.config.limits.max_batch_messages

    def _check(self, messages: list[pb.Message], batch: list[Outgoing]) -> None:
        """Size, headers and the header values the broker reads (broker/validation.py)."""
        stomp = self.engine.config.stomp
        for i, (m, out) in enumerate(zip(messages, batch, strict=True)):
            which = f"message {i} of the batch" if len(messages) > 1 else "message"
            if not m.address:
                raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{which}: empty address")
            try:
                check_size(out.body, out.headers, self.max_size)
                check_headers(out.headers, stomp.max_headers, stomp.max_header_size)
            except InvalidInput as err:
                raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{which}: {err}") from None

    async def _send(
        self, messages: Iterable[pb.Message], blocked: Callable[[], None] | None = None
    ) -> tuple[list[int], asyncio.Future[None] | None]:
        """Validate every message, then enqueue them all: all or nothing.

        Returns at once unless the send must wait: for room (address-full-policy BLOCK, or a
        full disk), or for a grouping decision. `blocked` tells a SendStream's client that
        its batch waits for room (a unary call can say nothing before its answer).
        """
        messages = list(messages)
        if len(messages) > self.max_batch:
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"a batch of {len(messages)} messages: more than limits.max-batch-messages "
                f"({self.max_batch}); send it as several batches",
            )
        batch = [Outgoing(m.address, m.body, _dict(m.headers), m.persistent) for m in messages]
        self._check(messages, batch)
        wait = self.engine.admit(list(dict.fromkeys((m.address, m.persistent) for m in batch)))
        if wait is not None:
            if blocked is not None:
                blocked()
            await wait
        sender = self.sending
        sent = sender.send_now(batch, now_ns())
        if sent is None:
            sent = await sender.send(batch)
        ids, fx = sent
        return ids, self.engine.apply(fx)

    async def Send(self, request: pb.SendRequest, context: aio.ServicerContext) -> pb.SendResponse:
        try:
            ids, write = await self._send((request.message,))
            if write is not None:
                await write
        except Exception as err:
            await _abort(context, err)
        return pb.SendResponse(msg_id=ids[0])

    async def SendBatch(
        self, request: pb.SendBatchRequest, context: aio.ServicerContext
    ) -> pb.SendBatchResponse:
        try:
            ids, write = await self._send(request.messages)
            if write is not None:
                await write
        except Exception as err:
            await _abort(context, err)
        return pb.SendBatchResponse(msg_ids=ids)

    async def SendStream(
        self, request_iterator: AsyncIterator[pb.SendBatchRequest], context: aio.ServicerContext
    ) -> AsyncIterator[pb.SendResult]:
        """Batches are enqueued as they arrive; results follow in order as writes complete.

        A batch that waits for a grouping decision holds back the batches behind it, so a
        stream's batches are always routed in the order they were sent.
        """
        Pending = tuple[int, list[int], asyncio.Future[None] | None] | pb.SendResult | NotServing
        results: asyncio.Queue[Pending | None] = asyncio.Queue()

        async def take() -> None:
            try:
                for n in itertools.count():
                    request = await anext(request_iterator, None)
                    if request is None:
                        return
                    await refuse_undecodable(request, context)

                    def blocked(n: int = n) -> None:
                        results.put_nowait(pb.SendResult(batch=n, blocked=True))

                    try:
                        results.put_nowait((n, *await self._send(request.messages, blocked)))
                    except NotServing as err:
                        results.put_nowait(err)
                        return
                    except (_Refused, CoreError) as err:
                        code = err.code if isinstance(err, _Refused) else _status(err)
                        results.put_nowait(
                            pb.SendResult(batch=n, error_code=code.name, error_message=str(err))
                        )
            finally:
                results.put_nowait(None)

        reader = asyncio.create_task(take())
        try:
            while (item := await results.get()) is not None:
                if isinstance(item, pb.SendResult):
                    yield item
                    continue
                if isinstance(item, NotServing):
                    await _gone(context, item)
                n, ids, write = item
                try:
                    if write is not None:
                        await write
                except NotServing as err:
                    await _gone(context, err)
                except StoreError as err:
                    yield pb.SendResult(batch=n, error_code="UNAVAILABLE", error_message=str(err))
                    continue
                yield pb.SendResult(batch=n, msg_ids=ids)
            await reader
        finally:
            reader.cancel()

    async def Consume(
        self, request_iterator: AsyncIterator[pb.ConsumeRequest], context: aio.ServicerContext
    ) -> None:
        engine, core = self.engine, self.engine.core
        first = await context.read()
        await refuse_undecodable(first, context)
        if first is aio.EOF:
            return
        if first.WhichOneof("kind") != "subscribe":
            await _refuse(
                context, grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a Subscribe"
            )
        sub = first.subscribe
        if sub.prefetch <= 0:
            await _refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"prefetch must be > 0, got {sub.prefetch}",
            )
        consumer_id = f"c-{uuid.uuid4().hex[:12]}"
        try:
            fx = core.subscribe(sub.queue, consumer_id, sub.consumer_name, sub.prefetch, now_ns())
        except CoreError as err:
            await _abort(context, err)
        stream = ConsumerStream(consumer_id, sub.queue)
        engine.streams[consumer_id] = stream
        tasks: list[asyncio.Task[Any]] = []
        try:
            engine.apply(fx)
            engine.consumers_changed(sub.queue)
            await context.write(
                pb.ConsumeResponse(subscribed=pb.Subscribed(consumer_id=consumer_id))
            )
            tasks = [
                asyncio.create_task(self._settle_loop(context, stream)),
                asyncio.create_task(self._write_loop(context, stream)),
            ]
            await asyncio.wait([*tasks, stream.ended], return_when=asyncio.FIRST_COMPLETED)
            if stream.ended.done():
                tasks[0].cancel()  # no new settles; those already taken get their receipts
                await _owed_receipts_sent(stream, tasks[1])
                code, reason = stream.ended.result()
                await _refuse(context, grpc.StatusCode[code], reason)
            for task in tasks:
                if task.done() and task.exception() is not None:
                    await _abort(context, task.exception())  # type: ignore[arg-type]
        finally:
            for task in tasks:
                task.cancel()
            del engine.streams[consumer_id]
            engine.apply(core.close_consumer(sub.queue, consumer_id, now_ns()))
            engine.consumers_changed(sub.queue)

    async def _settle_loop(self, context: aio.ServicerContext, stream: ConsumerStream) -> None:
        """Reads settles until the client half-closes; a refused settle ends the stream."""
        engine, core = self.engine, self.engine.core
        ops = {"ack": core.ack, "release": core.release, "reject": core.reject}
        while (request := await context.read()) is not aio.EOF:
            await refuse_undecodable(request, context)
            kind = request.WhichOneof("kind")
            if kind not in ops:
                raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"unexpected {kind} message")
            settle = getattr(request, kind)
            ids = list(settle.delivery_ids)
            fx = ops[kind](stream.queue, stream.consumer_id, ids, now_ns())
            engine.apply(fx, (stream, Receipt(ids)) if settle.want_receipt else None)

    async def _write_loop(self, context: aio.ServicerContext, stream: ConsumerStream) -> None:
        """Drains the outbound queue: all deliveries ready at once go out in one message."""
        outbound = stream.outbound
        while True:
            items = [await outbound.get()]
            stream.writing = True
            while not outbound.empty():
                items.append(outbound.get_nowait())
            try:
                first_key = self.engine.core.queue(stream.queue).settings.group_first_key
            except CoreError:
                return
            responses, unsendable = _pack(items, first_key)
            for response in responses:
                await context.write(response)
            stream.writing = False
            if unsendable:
                self._dead_letter(stream, unsendable)

    def _dead_letter(self, stream: ConsumerStream, unsendable: list[tuple[Delivery, str]]) -> None:
        """Deliveries that could not be encoded: rejected (dead-lettered), each logged by name.

        Only the message at fault goes: the rest of its batch was sent.
        """
        for d, error in unsendable:
            log.error(
                "message cannot be sent to a consumer: dead-lettered",
                queue=stream.queue,
                msg_id=d.message.msg_id,
                consumer=stream.consumer_id,
                error=error,
            )
        ids = [d.delivery_id for d, _ in unsendable]
        engine = self.engine
        engine.apply(engine.core.reject(stream.queue, stream.consumer_id, ids, now_ns()))


async def _owed_receipts_sent(stream: ConsumerStream, writer: asyncio.Task[None]) -> None:
    """Before a stream ends, send the receipts of settles it took (bounded: a stopping node).

    A client told "ended" for an ack that was in fact committed would retry it for nothing,
    or worse, count it as failed.
    """
    deadline = asyncio.get_running_loop().time() + OWED_RECEIPTS_S
    while (stream.owed or stream.writing or not stream.outbound.empty()) and not writer.done():
        if asyncio.get_running_loop().time() > deadline:
            return
        await asyncio.sleep(0.005)


def _pack(
    items: list[list[Delivery] | Receipt], first_key: str | None
) -> tuple[list[pb.ConsumeResponse], list[tuple[Delivery, str]]]:
    """Everything queued for a consumer, as few messages as the size cap allows, in order; and
    the deliveries that cannot be encoded (left out, with why), which must not sink the rest."""
    out: list[pb.ConsumeResponse] = []
    unsendable: list[tuple[Delivery, str]] = []
    current: pb.ConsumeResponse | None = None
    size = 0
    for item in items:
        if isinstance(item, Receipt):
            current = None
            out.append(pb.ConsumeResponse(settled=pb.Settled(delivery_ids=item.delivery_ids)))
            continue
        for d in item:
            if current is None or size >= PACK_BYTES:
                current, size = pb.ConsumeResponse(), 0
                out.append(current)
                add = current.deliveries.deliveries.add
            m = d.message
            headers = m.headers
            if d.first_in_group and first_key is not None:
                headers = {**headers, first_key: "true"}
            try:  # a failed add appends nothing
                add(
                    delivery_id=d.delivery_id,
                    msg_id=m.msg_id,
                    address=m.address,
                    queue=m.queue,
                    body=m.body,
                    headers=headers,
                    delivery_count=m.delivery_count + 1,
                    group_id=m.group or "",
                    group_seq=m.group_seq,
                    persistent=m.persistent,
                )
            except (ValueError, TypeError) as err:
                unsendable.append((d, str(err)))
                continue
            size += len(m.body)
    return out, unsendable


def _dict(headers: Mapping[str, str]) -> dict[str, str]:
    """A protobuf map as a dict (several times faster than dict(map))."""
    return {k: headers[k] for k in headers}


# ---- administration ---------------------------------------------------------------------------


class AdminService(pb_grpc.AdminServicer):
    def __init__(self, engine: Engine, admin: ClusterAdmin | None) -> None:
        self.engine = engine
        self.admin = admin

    async def CreateQueue(
        self, request: pb.CreateQueueRequest, context: aio.ServicerContext
    ) -> pb.CreateQueueResponse:
        if not request.queue or not request.address:
            await _refuse(
                context, grpc.StatusCode.INVALID_ARGUMENT, "address and queue must not be empty"
            )
        base = self.engine.config.queue_config_for(request.address).model_dump()
        try:
            settings = QueueConfig.model_validate({**base, **_settings_values(request.settings)})
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}"
                for e in err.errors()
            )
            await _refuse(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"invalid settings: {problems}"
            )
        try:
            await self.engine.create_queue(request.address, request.queue, settings)
        except Exception as err:
            await _abort(context, err)
        return pb.CreateQueueResponse()

    async def DeleteQueue(
        self, request: pb.DeleteQueueRequest, context: aio.ServicerContext
    ) -> pb.DeleteQueueResponse:
        try:
            removed = await self.engine.delete_queue(request.queue)
        except Exception as err:
            await _abort(context, err)
        return pb.DeleteQueueResponse(removed_messages=removed)

    async def ListQueues(
        self, request: pb.ListQueuesRequest, context: aio.ServicerContext
    ) -> pb.ListQueuesResponse:
        return pb.ListQueuesResponse(
            queues=[
                pb.QueueInfo(
                    name=q.name,
                    address=q.address,
                    depth=q.depth,
                    consumer_count=q.consumer_count,
                    settings=_settings_pb(q.settings),
                )
                for q in self.engine.core.queues()
            ]
        )

    async def ListGroups(
        self, request: pb.ListGroupsRequest, context: aio.ServicerContext
    ) -> pb.ListGroupsResponse:
        try:
            queue = self.engine.core.queue(request.queue)
        except CoreError as err:
            await _abort(context, err)
        groups = queue.groups()
        return pb.ListGroupsResponse(
            consumers=[
                pb.ConsumerInfo(
                    consumer_id=c.consumer_id,
                    name=c.name,
                    prefetch=c.prefetch,
                    unacked=c.unacked,
                    groups=c.groups,
                    stalled_ms=c.stalled_ms,
                )
                for c in queue.consumers(now_ns())
            ],
            groups=[
                pb.GroupInfo(
                    group=g.group,
                    owner_consumer_id=g.owner or "",
                    owner_name=g.owner_name or "",
                    pending=g.pending,
                    outstanding=g.outstanding,
                    last_use_unix_ms=g.last_use_ns // 1_000_000,
                )
                for g in groups
            ],
        )

    async def ResetGroups(
        self, request: pb.ResetGroupsRequest, context: aio.ServicerContext
    ) -> pb.ResetGroupsResponse:
        group = request.group if request.HasField("group") else None
        try:
            write = self.engine.apply(self.engine.core.reset_groups(request.queue, group, now_ns()))
            if write is not None:
                await write
        except Exception as err:
            await _abort(context, err)
        return pb.ResetGroupsResponse()

    # ---- the cluster ----

    async def _clustered(self, context: aio.ServicerContext) -> ClusterAdmin:
        if self.admin is None:
            await _refuse(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                "this node is not clustered (no cluster section)",
            )
        return self.admin  # type: ignore[return-value]

    async def ClusterGroups(
        self, request: pb.ClusterGroupsRequest, context: aio.ServicerContext
    ) -> pb.ClusterGroupsResponse:
        admin = await self._clustered(context)
        groups, unreachable = await admin.groups(request.queue or None, request.group or None)
        return pb.ClusterGroupsResponse(
            groups=[
                pb.ClusterGroupInfo(
                    group=g.group,
                    queue=g.queue,
                    node=g.node,
                    bound=g.bound,
                    owner_consumer_id=g.owner or "",
                    owner_name=g.owner_name or "",
                    pending=g.pending,
                    outstanding=g.outstanding,
                    last_use_unix_ms=g.last_use_unix_ms,
                )
                for g in groups
            ],
            unreachable=unreachable,
            problems=admin.problems(),
        )

    async def ClusterResetGroup(
        self, request: pb.ClusterResetGroupRequest, context: aio.ServicerContext
    ) -> pb.ClusterResetGroupResponse:
        admin = await self._clustered(context)
        queue = request.queue if request.HasField("queue") else None
        try:
            removed = await admin.reset_group(request.group, queue, request.force)
        except CoreError as err:
            await _abort(context, err)
        return pb.ClusterResetGroupResponse(removed=removed)

    async def ClusterStatus(
        self, request: pb.ClusterStatusRequest, context: aio.ServicerContext
    ) -> pb.ClusterStatusResponse:
        admin = await self._clustered(context)
        return pb.ClusterStatusResponse(
            node_id=admin.node_id,
            nodes=[
                pb.ClusterNodeStatus(
                    node_id=n.node_id,
                    connected=n.connected,
                    handler=n.handler,
                    consumers=n.consumers,
                )
                for n in admin.status()
            ],
            problems=admin.problems(),
            ha=[
                pb.HaPairStatus(
                    logical=p.logical,
                    epoch=p.epoch,
                    active=p.active,
                    backup=p.backup,
                    backup_in_sync=p.backup_in_sync,
                    from_active=p.from_active,
                )
                for p in admin.ha()
            ],
        )


def _settings_values(settings: pb.QueueSettings) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in _SETTINGS_FIELDS:
        if settings.HasField(name):
            value = getattr(settings, name)
            values[name] = None if name in _NULLABLE and value == "" else value
    return values


def _settings_pb(settings: QueueConfig) -> pb.QueueSettings:
    values = {name: getattr(settings, name) for name in _SETTINGS_FIELDS}
    return pb.QueueSettings(
        **{k: ("" if v is None and k in _NULLABLE else v) for k, v in values.items()}
    )
