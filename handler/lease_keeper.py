"""A REMOTE node's lease from the LOCAL grouping handler: asked for, renewed, and lost.

With `rebind-absent-after` set on the LOCAL node, that node may re-bind the groups of a node
it has not heard from, and the node may be cut off rather than down, still serving its
consumers. So a REMOTE node delivers grouped messages only while it holds a lease (the
arbiter's side: handler/leases.py). It asks for one with `Lease` every third of the lease and
counts it from the moment it sent the request; once that time has passed without a renewal,
`on_lapse` runs at once (a timer, not the next renewal): the node holds its groups and takes
back what its consumers hold (cluster/claims.py), and asks no decision until a lease holds
again.

A LOCAL node without `rebind-absent-after` answers lease 0: leases are off, the node delivers
without one, and asks again every OFF_RENEW_S in case the LOCAL node restarts with them on (a
LOCAL node that starts counts every node as leased for a whole lease, so that is soon enough).
A LOCAL node that does not know the call (UNIMPLEMENTED) has leases off too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import structlog
from grpc import aio

from pinmq_pb import grouping_pb2 as pb
from pinmq_pb import grouping_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

OFF_RENEW_S = 1.0
_MS = 1_000_000


class LeaseKeeper:
    """The node's lease: `holds()` says whether it may deliver grouped messages now."""

    def __init__(
        self,
        node_id: str,
        stub: Callable[[], pb_grpc.GroupingHandlerStub | None],
        current: Callable[[int], bool],
        on_lapse: Callable[[], None],
        *,
        retry_s: float,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.node_id = node_id
        self._stub = stub
        self._current = current  # is an answer of that arbiter epoch to be heeded?
        self._on_lapse = on_lapse
        self._retry_s = retry_s
        self._clock = clock
        self.until: int | None = 0  # when the lease runs out (ns); 0: none yet; None: leases off
        self.lease_ms = 0  # as last granted (0: off, or none yet)
        self.lapses = 0  # how many times a held lease ran out
        self.failure = ""  # why the last call for a lease failed ("" once one answered)
        self._lapsed = False
        self._timer: asyncio.TimerHandle | None = None

    def holds(self) -> bool:
        return self.until is None or self._clock() < self.until

    async def run(self) -> None:
        """Ask, renew, and ask again; runs until cancelled."""
        try:
            while True:
                await asyncio.sleep(await self.renew())
        finally:
            if self._timer is not None:
                self._timer.cancel()

    async def renew(self) -> float:
        """One `Lease` call; how long to wait before the next."""
        stub = self._stub()
        if stub is None:
            return self._retry_s
        sent = self._clock()
        try:
            reply = await stub.Lease(pb.LeaseRequest(node=self.node_id), timeout=self._period())
        except aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._granted(sent, 0)
                return self._period()
            log.debug("lease not renewed", code=err.code().name, error=err.details())
            self.failure = f"{err.code().name}: {err.details()}"
            return self._retry_s
        if not self._current(reply.arbiter_epoch):
            self.failure = f"answered by an arbiter of an older epoch ({reply.arbiter_epoch})"
            return self._retry_s
        self.failure = ""
        self._granted(sent, reply.lease_ms)
        return self._period()

    def _period(self) -> float:
        """Seconds between renewals: a third of the lease, or OFF_RENEW_S with leases off."""
        return self.lease_ms / 3000 if self.lease_ms else OFF_RENEW_S

    def _granted(self, sent_ns: int, lease_ms: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.lease_ms = lease_ms
        if lease_ms == 0:
            self.until = None
        else:
            self.until = max(self.until or 0, sent_ns + lease_ms * _MS)
            delay = (self.until - self._clock()) / 1e9
            self._timer = asyncio.get_running_loop().call_later(max(0.0, delay), self._expire)
        if self._lapsed and self.holds():
            self._lapsed = False
            log.info("grouping lease held again: grouped delivery resumes", lease_ms=lease_ms)

    def _expire(self) -> None:
        self._timer = None
        if self.holds() or self._lapsed:
            return
        self._lapsed = True
        self.lapses += 1
        log.warning(
            "grouping lease lapsed: this node holds its groups until the LOCAL grouping handler"
            " answers again",
            lease_ms=self.lease_ms,
        )
        self._on_lapse()
