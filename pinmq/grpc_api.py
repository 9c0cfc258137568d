"""The client-facing gRPC shell: the server, and the Broker service (send and consume).

Handlers validate, run the engine's commands in a unit and await only the store write that
confirms the request. Consumer streams are written by one task per consumer that packs
everything queued for it into as few messages as possible. The Admin service is
`pinmq/grpc_admin.py`; how a refused call ends, `pinmq/grpc_status.py`.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import grpc
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client.registry import CollectorRegistry

from broker import channels, logs
from broker.access import Access
from broker.admin import ClusterAdmin
from broker.authenticator import Authenticator
from broker.clock import now_ns
from broker.core import CoreError
from broker.effects import Delivery
from broker.engine import Engine, NotServing
from broker.message import Outgoing
from broker.permissions import Denied
from broker.readiness import Readiness
from broker.refusals import Refusals
from broker.sending import SendPath
from broker.store import StoreError
from broker.streams import ConsumerStream, Receipt
from broker.validation import InvalidInput, check_headers, check_size
from pinmq.grpc_access import Gate
from pinmq.grpc_admin import AdminService
from pinmq.grpc_decode import refuse_undecodable, register
from pinmq.grpc_status import Refused, gone, status_of
from pinmq_pb import client_pb2 as pb
from pinmq_pb import client_pb2_grpc as pb_grpc

log = logs.get("grpc")

PACK_BYTES = 1 << 20  # a Deliveries message is cut after this many body bytes
FRAME_SLACK = 1 << 20  # gRPC receive limit = max-message-size + this (batches, headers)
_SERVICES = ("pinmq.client.v1.Broker", "pinmq.client.v1.Admin")
OWED_RECEIPTS_S = 2.0  # how long an ending consume stream waits to send the receipts it owes
_SETTLES = frozenset(("ack", "release", "reject"))


def make_server(
    engine: Engine,
    sending: SendPath,
    admin: ClusterAdmin | None,
    authenticator: Authenticator | None,
    *,
    refusals: Refusals,
    metrics: CollectorRegistry,
    readiness: Callable[[], Readiness],
) -> tuple[aio.Server, health.aio.HealthServicer]:
    """A gRPC server with the Broker, Admin and health services, bound to listen.client;
    Admin answers with the node's `metrics` registry and `readiness` too."""
    limit = engine.config.limits.max_message_size
    server = aio.server(
        options=[
            ("grpc.max_receive_message_length", limit + FRAME_SLACK),
            ("grpc.so_reuseport", 0),  # a second node on the same port must fail, not share
            *channels.serve_keepalive(),  # a frozen client is noticed, its deliveries go back
        ]
    )
    gate = Gate(authenticator, refusals)
    register(pb_grpc.add_BrokerServicer_to_server, BrokerService(engine, sending, gate), server)
    admin_service = AdminService(engine, admin, gate, metrics, readiness)
    register(pb_grpc.add_AdminServicer_to_server, admin_service, server)
    health_service = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_service, server)
    address, tls = engine.config.listen.client, engine.config.tls
    try:
        required = tls is not None and tls.client_auth == "required"
        channels.listen(server, address, engine.config.tls_files, required)
    except RuntimeError:
        raise OSError(f"cannot listen on {address} (in use or not a local address)") from None
    return server, health_service


async def mark_serving(health_service: health.aio.HealthServicer) -> None:
    """Report SERVING for the server as a whole and for each pinmq service."""
    for service in ("", *_SERVICES):
        await health_service.set(service, health_pb2.HealthCheckResponse.SERVING)


# ---- producing and consuming ------------------------------------------------------------------


class BrokerService(pb_grpc.BrokerServicer):
    def __init__(self, engine: Engine, sending: SendPath, gate: Gate) -> None:
        self.engine = engine
        self.sending = sending
        self.gate = gate
        self.max_size = engine.config.limits.max_message_size
        self.max_batch = engine.config.limits.max_batch_messages

    def _check(self, messages: list[pb.Message], batch: list[Outgoing]) -> None:
        """Size, headers and the header values the broker reads (broker/validation.py)."""
        stomp = self.engine.config.stomp
        for i, (m, out) in enumerate(zip(messages, batch, strict=True)):
            which = f"message {i} of the batch" if len(messages) > 1 else "message"
            if not m.address:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{which}: empty address")
            try:
                check_size(out.body, out.headers, self.max_size)
                check_headers(out.headers, stomp.max_headers, stomp.max_header_size)
            except InvalidInput as err:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{which}: {err}") from None

    async def _send(
        self,
        messages: Iterable[pb.Message],
        access: Access,
        blocked: Callable[[], None] | None = None,
    ) -> tuple[list[int], asyncio.Future[None] | None]:
        """Validate every message, then enqueue them all: all or nothing.

        Returns at once unless the send must wait: for room (address-full-policy BLOCK, or a
        full disk), or for a grouping decision. `blocked` tells a SendStream's client that
        its batch waits for room (a unary call can say nothing before its answer).
        """
        messages = list(messages)
        if len(messages) > self.max_batch:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"a batch of {len(messages)} messages: more than limits.max-batch-messages "
                f"({self.max_batch}); send it as several batches",
            )
        batch = [Outgoing(m.address, m.body, _dict(m.headers), m.persistent) for m in messages]
        self._check(messages, batch)
        access.check_send(dict.fromkeys(m.address for m in batch), self.engine.creates)
        wait = self.engine.admit(list(dict.fromkeys((m.address, m.persistent) for m in batch)))
        if wait is not None:
            if blocked is not None:
                blocked()
            await wait
        sender = self.sending
        with self.engine.unit() as unit:  # empty while `send` awaits its decisions
            ids = sender.send_now(batch, unit, now_ns())
            if ids is None:
                ids = await sender.send(batch, unit)
        return ids, unit.write

    async def Send(self, request: pb.SendRequest, context: aio.ServicerContext) -> pb.SendResponse:
        access = await self.gate.access(context)
        try:
            ids, write = await self._send((request.message,), access)
            if write is not None:
                await write
        except Denied as err:
            await self.gate.deny(context, err)
        except Exception as err:
            await self.gate.abort(context, err)
        return pb.SendResponse(msg_id=ids[0])

    async def SendBatch(
        self, request: pb.SendBatchRequest, context: aio.ServicerContext
    ) -> pb.SendBatchResponse:
        access = await self.gate.access(context)
        try:
            ids, write = await self._send(request.messages, access)
            if write is not None:
                await write
        except Denied as err:
            await self.gate.deny(context, err)
        except Exception as err:
            await self.gate.abort(context, err)
        return pb.SendBatchResponse(msg_ids=ids)

    async def SendStream(
        self, request_iterator: AsyncIterator[pb.SendBatchRequest], context: aio.ServicerContext
    ) -> AsyncIterator[pb.SendResult]:
        """Batches are enqueued as they arrive; results follow in order as writes complete.

        A batch that waits for a grouping decision holds back the batches behind it, so a
        stream's batches are always routed in the order they were sent.
        """
        access = await self.gate.access(context)
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
                        sent = await self._send(request.messages, access, blocked)
                        results.put_nowait((n, *sent))
                    except NotServing as err:
                        results.put_nowait(err)
                        return
                    except (Refused, CoreError, Denied) as err:
                        if isinstance(err, Denied):
                            self.gate.record(err, context)
                            code = grpc.StatusCode.PERMISSION_DENIED
                        elif isinstance(err, Refused):
                            code = err.code
                        else:
                            code = status_of(err)
                        self.gate.refusals.count("grpc", code.name)
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
                    await gone(context, item)
                n, ids, write = item
                try:
                    if write is not None:
                        await write
                except NotServing as err:
                    await gone(context, err)
                except StoreError as err:
                    self.gate.refusals.count("grpc", "UNAVAILABLE")
                    yield pb.SendResult(batch=n, error_code="UNAVAILABLE", error_message=str(err))
                    continue
                yield pb.SendResult(batch=n, msg_ids=ids)
            await reader
        finally:
            reader.cancel()

    async def Consume(
        self, request_iterator: AsyncIterator[pb.ConsumeRequest], context: aio.ServicerContext
    ) -> None:
        engine = self.engine
        access = await self.gate.access(context)
        first = await context.read()
        await refuse_undecodable(first, context)
        if first is aio.EOF:
            return
        if first.WhichOneof("kind") != "subscribe":
            await self.gate.refuse(
                context, grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a Subscribe"
            )
        sub = first.subscribe
        if sub.prefetch <= 0:
            await self.gate.refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"prefetch must be > 0, got {sub.prefetch}",
            )
        try:
            access.check("consume", sub.queue)
        except Denied as err:
            await self.gate.deny(context, err)
        consumer_id = f"c-{uuid.uuid4().hex[:12]}"
        try:
            with engine.unit() as unit:
                stream = unit.subscribe(sub.queue, consumer_id, sub.consumer_name, sub.prefetch)
        except CoreError as err:
            await self.gate.abort(context, err)
        tasks: list[asyncio.Task[Any]] = []
        try:
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
                await self.gate.refuse(context, grpc.StatusCode[code], reason)
            for task in tasks:
                if task.done() and task.exception() is not None:
                    await self.gate.abort(context, task.exception())  # type: ignore[arg-type]
        finally:
            for task in tasks:
                task.cancel()
            with engine.unit() as unit:
                unit.unsubscribe(stream)

    async def _settle_loop(self, context: aio.ServicerContext, stream: ConsumerStream) -> None:
        """Reads settles until the client half-closes; a refused settle ends the stream."""
        engine = self.engine
        while (request := await context.read()) is not aio.EOF:
            await refuse_undecodable(request, context)
            kind = request.WhichOneof("kind")
            if kind not in _SETTLES:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"unexpected {kind} message")
            settle = getattr(request, kind)
            with engine.unit() as unit:
                unit.settle(stream, kind, settle.delivery_ids, settle.want_receipt)

    async def _write_loop(self, context: aio.ServicerContext, stream: ConsumerStream) -> None:
        """Drains the outbound queue: all deliveries ready at once go out in one message."""
        outbound = stream.outbound
        while True:
            items = [await outbound.get()]
            stream.writing = True
            while not outbound.empty():
                items.append(outbound.get_nowait())
            responses, unsendable = _pack(items, stream.first_key)
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
        with self.engine.unit() as unit:
            unit.settle(stream, "reject", [d.delivery_id for d, _ in unsendable])


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
