"""`pinmq.grouping.v1.GroupingHandler`: the LOCAL grouping handler as REMOTE nodes reach it.

A thin shell over `LocalHandler`: it checks requests, turns them into calls and the answers
into messages (`handler/wire.py` holds what the REMOTE side must read the same way). Built
beside its handler by `handler/factory.py` and hosted on the cluster's gRPC server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import structlog
from grpc import aio

from handler.api import DecisionTimeout, HandlerUnavailable
from handler.bindings import BindingStoreError
from handler.local import MAX_REMOVAL_BACKLOG, LocalHandler
from handler.records import Binding
from handler.wire import HEARTBEAT_S, REASON_TO_PB, SUBSCRIBED
from pinmq_pb import grouping_pb2 as pb
from pinmq_pb import grouping_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

_EMPTY_FIELDS = "group, queue and node must not be empty"


def _reply(binding: Binding, accepted: bool, arbiter_epoch: int) -> pb.BindingReply:
    return pb.BindingReply(
        group=binding.group,
        queue=binding.queue,
        node=binding.node,
        epoch=binding.epoch,
        accepted=accepted,
        arbiter_epoch=arbiter_epoch,
    )


class GroupingServicer(pb_grpc.GroupingHandlerServicer):
    """`pinmq.grouping.v1.GroupingHandler` over a LocalHandler."""

    def __init__(self, handler: LocalHandler) -> None:
        self.handler = handler
        self.proposals = 0  # proposals received, by Propose and ProposeStream
        self.batches = 0  # ProposeStream batches received

    def add_to_server(self, server: aio.Server) -> None:
        """Host this service on `server` (before it starts)."""
        pb_grpc.add_GroupingHandlerServicer_to_server(self, server)

    async def Propose(
        self, request: pb.ProposeRequest, context: aio.ServicerContext
    ) -> pb.BindingReply:
        self.proposals += 1
        decision = await self._decision(request)
        if decision.error:
            invalid = decision.error == _EMPTY_FIELDS
            code = grpc.StatusCode.INVALID_ARGUMENT if invalid else grpc.StatusCode.UNAVAILABLE
            await context.abort(code, decision.error)
        return decision.binding

    async def ProposeStream(
        self, request_iterator: AsyncIterator[pb.ProposeBatch], context: aio.ServicerContext
    ) -> AsyncIterator[pb.DecisionBatch]:
        """Every proposal is decided at once; answers leave in batches as they become durable."""
        done: list[pb.Decision] = []
        ready = asyncio.Event()
        deciding: set[asyncio.Task[None]] = set()
        reading = True

        async def answer(request: pb.ProposeRequest) -> None:
            done.append(await self._decision(request))
            ready.set()

        async def read() -> None:
            nonlocal reading
            try:
                async for batch in request_iterator:
                    self.batches += 1
                    self.proposals += len(batch.proposals)
                    for request in batch.proposals:
                        task = asyncio.create_task(answer(request))
                        deciding.add(task)
                        task.add_done_callback(deciding.discard)
            finally:
                reading = False
                ready.set()

        reader = asyncio.create_task(read())
        try:
            while reading or deciding or done:
                await ready.wait()
                ready.clear()
                if done:
                    batch, done[:] = list(done), []
                    yield pb.DecisionBatch(decisions=batch)
            await reader  # a failed read ends the call with its error
        finally:
            for task in (reader, *deciding):
                task.cancel()

    async def _decision(self, request: pb.ProposeRequest) -> pb.Decision:
        if not (request.group and request.queue and request.node):
            return pb.Decision(id=request.id, error=_EMPTY_FIELDS)
        try:
            binding, accepted = await self.handler.propose(
                request.group, request.queue, request.node
            )
        except (BindingStoreError, DecisionTimeout, HandlerUnavailable) as err:
            return pb.Decision(id=request.id, error=str(err))
        epoch = self.handler.arbiter.epoch
        return pb.Decision(id=request.id, binding=_reply(binding, accepted, epoch))

    async def Touch(self, request: pb.TouchRequest, context: aio.ServicerContext) -> pb.TouchReply:
        keys = [(k.group, k.queue, k.node) for k in request.keys]
        stale = self.handler.touch_keys(keys, request.validate_only)
        return pb.TouchReply(
            stale=[pb.Key(group=g, queue=q, node=n) for g, q, n in stale],
            arbiter_epoch=self.handler.arbiter.epoch,
        )

    async def Lease(self, request: pb.LeaseRequest, context: aio.ServicerContext) -> pb.LeaseReply:
        if not request.node:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "node must not be empty")
        try:
            lease_ms = self.handler.grant_lease(request.node)
        except HandlerUnavailable as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        return pb.LeaseReply(lease_ms=lease_ms, arbiter_epoch=self.handler.arbiter.epoch)

    async def Removals(
        self, request: pb.RemovalsRequest, context: aio.ServicerContext
    ) -> AsyncIterator[pb.Removal]:
        sub = self.handler.subscribe(request.node)
        epoch = self.handler.arbiter.epoch
        log.info("removals subscriber joined", subscriber=request.node)
        try:
            await context.send_initial_metadata((SUBSCRIBED,))
            while True:
                try:
                    async with asyncio.timeout(HEARTBEAT_S):
                        await sub.event.wait()
                except TimeoutError:
                    yield pb.Removal(arbiter_epoch=epoch)  # heartbeat: notices a dead link
                    continue
                sub.event.clear()
                if sub.overflow:
                    await context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"more than {MAX_REMOVAL_BACKLOG} removals not yet read: resubscribe",
                    )
                while sub.items:
                    binding, reason = sub.items.popleft()
                    yield pb.Removal(
                        group=binding.group,
                        queue=binding.queue,
                        node=binding.node,
                        epoch=binding.epoch,
                        reason=REASON_TO_PB[reason],
                        arbiter_epoch=epoch,
                    )
                if sub.closed:
                    return
        finally:
            self.handler.unsubscribe(sub)
            log.info("removals subscriber left", subscriber=request.node)

    async def List(self, request: pb.ListRequest, context: aio.ServicerContext) -> pb.ListReply:
        listed = await self.handler.list_bindings(request.group or None, request.limit)
        return pb.ListReply(
            bindings=[
                pb.BindingInfo(
                    group=b.group,
                    queue=b.queue,
                    node=b.node,
                    epoch=b.epoch,
                    last_use_unix_ms=last_use,
                )
                for b, last_use in listed
            ]
        )

    async def Unbind(
        self, request: pb.UnbindRequest, context: aio.ServicerContext
    ) -> pb.UnbindReply:
        if not request.group:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "group must not be empty")
        queue = request.queue if request.HasField("queue") else None
        try:
            removed = await self.handler.unbind(request.group, queue)
        except HandlerUnavailable as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        return pb.UnbindReply(removed=removed)
