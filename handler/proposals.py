"""A REMOTE node's proposals to the LOCAL node, many at a time over one `ProposeStream` call.

A unary `Propose` per new group costs more CPU on both sides than the decision itself, which
caps how many new groups a cluster can bind per second. On one stream, the proposals made
while the previous batch is being written leave together as the next batch, and answers come
back in batches too, so the cost per decision falls as the load rises.

A stream lives on one channel. When it fails (the LOCAL node went away, the channel was
closed, the server ended the call), every proposal waiting on it fails with the reason and
the stream stays broken; the caller retries on a new one.
"""

from __future__ import annotations

import asyncio
import itertools

from grpc import aio

from pinmq_pb import grouping_pb2 as pb
from pinmq_pb import grouping_pb2_grpc as pb_grpc


class StreamEnded(Exception):
    """The LOCAL node ended the stream without an error (it is shutting down)."""


class ProposalRefused(Exception):
    """The LOCAL node answered this proposal with an error instead of a binding."""


class ProposalStream:
    """One `ProposeStream` call and the proposals waiting for its answers."""

    def __init__(self, stub: pb_grpc.GroupingHandlerStub) -> None:
        # wait_for_ready: a stream opened while the LOCAL node is unreachable waits for it.
        self._call = stub.ProposeStream(wait_for_ready=True)
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[pb.BindingReply]] = {}
        self._outbox: list[pb.ProposeRequest] = []
        self._wake = asyncio.Event()
        self.failure: Exception | None = None
        self._tasks = (
            asyncio.create_task(self._send(), name="grouping-proposals-send"),
            asyncio.create_task(self._receive(), name="grouping-proposals-receive"),
        )

    async def propose(self, group: str, queue: str, node: str) -> pb.BindingReply:
        """The LOCAL node's answer; raises the stream's failure or ProposalRefused."""
        if self.failure is not None:
            raise self.failure
        request = pb.ProposeRequest(group=group, queue=queue, node=node, id=next(self._ids))
        future: asyncio.Future[pb.BindingReply] = asyncio.get_running_loop().create_future()
        self._waiting[request.id] = future
        self._outbox.append(request)
        self._wake.set()
        try:
            return await future
        finally:
            self._waiting.pop(request.id, None)

    def close(self) -> None:
        self._fail(StreamEnded("the proposal stream was closed"))

    async def _send(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                batch, self._outbox = self._outbox, []
                await self._call.write(pb.ProposeBatch(proposals=batch))
        except asyncio.InvalidStateError:
            return  # the call has ended: `_receive` reads its status, the failure's real cause
        except Exception as err:
            self._fail(err)

    async def _receive(self) -> None:
        try:
            while (reply := await self._call.read()) is not aio.EOF:
                for decision in reply.decisions:
                    future = self._waiting.get(decision.id)
                    if future is None or future.done():
                        continue  # its caller gave up
                    if decision.error:
                        future.set_exception(ProposalRefused(decision.error))
                    else:
                        future.set_result(decision.binding)
            self._fail(StreamEnded("the LOCAL grouping handler ended the proposal stream"))
        except Exception as err:
            self._fail(err)

    def _fail(self, err: Exception) -> None:
        """Break the stream: its waiters get an AioRpcError or StreamEnded, saying why."""
        if self.failure is not None:
            return
        if not isinstance(err, aio.AioRpcError | StreamEnded):
            wrapped = StreamEnded(f"the proposal stream failed: {err!r}")
            wrapped.__cause__ = err
            err = wrapped
        self.failure = err
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(err)
        self._call.cancel()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
