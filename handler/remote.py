"""The REMOTE grouping handler: a cache of the LOCAL node's decisions, kept honest by a stream.

A hit (`cached`, or `decide` on a known key) costs a dict lookup and, at most once per
refresh period, an append to a list: no I/O, no await. A miss becomes one proposal to the
LOCAL node (on the one `ProposeStream` call this node keeps open, `handler/proposals.py`),
shared by every concurrent miss of the same key and bounded by `timeout` in total (locating
the LOCAL node and reconnecting included); past it `DecisionTimeout` says which group, queue
and timeout, and why.

Bindings in use are reported with batched `Touch` calls by a background task, at most once
per group-timeout/2 per binding, so the LOCAL reaper sees them used. The removal stream evicts
cache entries; when it (re)connects, the cache is validated against the LOCAL node (removals
sent while it was down are otherwise lost). Cached bindings keep answering while the LOCAL
node is unreachable: a group stays where it is pinned.

With `rebind-absent-after` set on the LOCAL node, this node asks no decision and keeps no
binding while it holds no lease from it (handler/lease_keeper.py): when the lease lapses the
cache is emptied and `on_lease_lapsed` callbacks run.

Every answer names the epoch of the arbiter that gave it (an ha pair's failover epoch). An
answer from an older epoch than the newest heard is ignored: a fenced arbiter that still
answers for a moment can never overrule the one that replaced it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc
import structlog
from grpc import aio

from broker import channels
from broker.config import GroupingHandlerSection
from broker.tls import TlsFiles
from handler.api import (
    LIST_LIMIT,
    BindingUse,
    DecisionTimeout,
    GroupingHandler,
    HandlerUnavailable,
    RemovalReason,
)
from handler.lease_keeper import LeaseKeeper
from handler.proposals import ProposalRefused, ProposalStream, StreamEnded
from handler.records import Binding, Key
from handler.wire import HEARTBEAT_S, PB_TO_REASON, SUBSCRIBED, to_binding
from pinmq_pb import grouping_pb2 as pb
from pinmq_pb import grouping_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

_NO_LEASE = "this node holds no lease from the LOCAL grouping handler (not yet, or it lapsed)"
TOUCH_BATCH = 10_000  # keys per Touch call
SILENCE_S = 3 * HEARTBEAT_S  # a Removals stream this quiet is dead: reconnect
_MS = 1_000_000


class _Cached:
    """A cached binding; `refreshed`: when the LOCAL node last heard of its use."""

    __slots__ = ("binding", "refreshed", "used")

    def __init__(self, binding: Binding, refreshed: int, used: bool) -> None:
        self.binding = binding
        self.refreshed = refreshed
        self.used = used  # used since `refreshed` (and then queued in `_used`)


class _Flight:
    """One Propose in progress for a key, and the bindings of that key removed meanwhile."""

    __slots__ = ("removed", "task")

    def __init__(self) -> None:
        self.removed: set[Binding] = set()
        self.task: asyncio.Task[Binding] | None = None


class RemoteHandler(GroupingHandler):
    """The REMOTE grouping handler of one node (see the module docstring)."""

    def __init__(
        self,
        locate_local: Callable[[], str | None],
        config: GroupingHandlerSection,
        node_id: str,
        *,
        reconnect_interval_ms: int = 500,
        tls: TlsFiles | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        super().__init__()
        self.config = config
        self.tls = tls  # mutual TLS with the LOCAL node, when the node has tls
        self.node_id = node_id
        self._locate = locate_local
        self._reconnect_s = reconnect_interval_ms / 1000
        self._clock = clock
        self._cache: dict[Key, _Cached] = {}
        self._used: list[_Cached] = []
        self._flights: dict[Key, _Flight] = {}
        self._target: str | None = None
        self._channel: aio.Channel | None = None
        self._stub_: pb_grpc.GroupingHandlerStub | None = None
        self._proposals: ProposalStream | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closing: set[asyncio.Task[None]] = set()  # old channels being closed
        self.subscribed = asyncio.Event()  # the Removals stream is live (for health and tests)
        self.arbiter_epoch = 0  # the newest arbiter epoch heard from
        self._ignored_epoch: tuple[int, int] | None = None  # the stale answer last warned of
        self.lease = LeaseKeeper(
            node_id,
            self._stub,
            self._current,
            self._lease_lapsed,
            retry_s=self._reconnect_s,
            clock=clock,
        )

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._removals_loop(), name="grouping-removals"),
            asyncio.create_task(self.lease.run(), name="grouping-lease"),
        ]
        if self.config.group_timeout >= 0:
            self._tasks.append(asyncio.create_task(self._touch_loop(), name="grouping-touch"))

    async def stop(self) -> None:
        tasks = self._tasks + [f.task for f in self._flights.values() if f.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, *self._closing, return_exceptions=True)
        self._tasks = []
        if self._proposals is not None:
            self._proposals.close()
            self._proposals = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._target = None

    # ---- decisions ----------------------------------------------------------------------

    def cached(self, group: str, queue: str) -> Binding | None:
        entry = self._cache.get((group, queue))
        if entry is None:
            return None
        if not entry.used:
            entry.used = True
            self._used.append(entry)
        return entry.binding

    async def decide(self, group: str, queue: str, proposal_node: str) -> Binding:
        key = (group, queue)
        entry = self._cache.get(key)
        if entry is not None:
            if not entry.used:
                entry.used = True
                self._used.append(entry)
            return entry.binding
        flight = self._flights.get(key)
        if flight is None:
            flight = self._flights[key] = _Flight()
            flight.task = task = asyncio.create_task(self._propose(key, proposal_node, flight))
            task.add_done_callback(lambda t: self._landed(key, flight, t))
        assert flight.task is not None
        return await asyncio.shield(flight.task)  # one caller giving up cancels no other

    def _landed(self, key: Key, flight: _Flight, task: asyncio.Task[Binding]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if not task.cancelled():
            task.exception()  # seen, even if every caller has given up

    async def _propose(self, key: Key, node: str, flight: _Flight) -> Binding:
        group, queue = key
        why = ""  # the last attempt's failure: an attempt cut short by the deadline keeps it
        pause = 0.05
        stats, asked = self.stats, self._clock()
        stats.proposals += 1
        try:
            async with asyncio.timeout(self.config.timeout / 1000):
                while True:
                    proposals = self._proposal_stream()
                    if proposals is None:
                        why = "no LOCAL grouping handler is known in the cluster"
                    elif not self.lease.holds():
                        why = self._no_lease()
                    else:
                        try:
                            reply = await proposals.propose(group, queue, node)
                        except aio.AioRpcError as err:
                            why = (
                                f"the LOCAL grouping handler at {self._target} is unreachable"
                                f" ({err.code().name}: {err.details()})"
                            )
                        except (ProposalRefused, StreamEnded) as err:
                            why = f"the LOCAL grouping handler at {self._target}: {err}"
                        else:
                            binding = to_binding(reply)
                            if not self._current(reply.arbiter_epoch):
                                why = self._stale(reply.arbiter_epoch)
                            elif not self.lease.holds():  # it lapsed meanwhile
                                why = self._no_lease()
                            elif binding in flight.removed:  # removed before the answer came
                                flight.removed.clear()
                                continue
                            else:
                                # With group-timeout -1 nothing is refreshed: never queue it.
                                untracked = self.config.group_timeout < 0
                                now = self._clock()
                                self._cache[key] = _Cached(binding, now, untracked)
                                stats.decisions.observe(now - asked)
                                return binding
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, self._reconnect_s)
        except TimeoutError:
            stats.timeouts += 1
            if not why:
                connected = self._channel is not None and (
                    self._channel.get_state() == grpc.ChannelConnectivity.READY
                )
                state = "did not answer" if connected else "is unreachable"
                why = f"the LOCAL grouping handler at {self._target} {state}"
            raise DecisionTimeout(
                f"no grouping decision for group {group!r} on queue {queue!r} within "
                f"{self.config.timeout} ms: {why}"
            ) from None

    def _current(self, epoch: int) -> bool:
        """Is an answer of an arbiter at `epoch` to be heeded (no newer arbiter answered)?"""
        if epoch < self.arbiter_epoch:
            if self._ignored_epoch != (epoch, self.arbiter_epoch):  # once, not per retry
                self._ignored_epoch = (epoch, self.arbiter_epoch)
                log.warning("older arbiter ignored", epoch=epoch, newest=self.arbiter_epoch)
            return False
        if epoch > self.arbiter_epoch:
            if self.arbiter_epoch:
                log.info("new arbiter epoch", local=self._target, epoch=epoch)
            self.arbiter_epoch = epoch
        return True

    def _no_lease(self) -> str:
        failure = self.lease.failure
        return f"{_NO_LEASE}; asked at {self._target}: {failure}" if failure else _NO_LEASE

    def _lease_lapsed(self) -> None:
        """Forget every cached binding: whatever changed meanwhile, each is asked again."""
        self._cache.clear()
        self._used.clear()
        self._lapsed()

    def _stale(self, epoch: int) -> str:
        return (
            f"the grouping handler at {self._target} answered at arbiter epoch {epoch}, "
            f"older than epoch {self.arbiter_epoch}"
        )

    # ---- operators ----------------------------------------------------------------------

    async def list_bindings(
        self, group: str | None = None, limit: int = LIST_LIMIT
    ) -> list[BindingUse]:
        reply = await self._admin("List", pb.ListRequest(group=group or "", limit=limit))
        return [BindingUse(to_binding(b), b.last_use_unix_ms) for b in reply.bindings]

    async def unbind(self, group: str, queue: str | None = None) -> int:
        request = pb.UnbindRequest(group=group)
        if queue is not None:
            request.queue = queue
        reply = await self._admin("Unbind", request)
        # Read your own reset: the LOCAL node's removals reach this cache on their own stream,
        # maybe after the next send through this node, which would follow the old binding.
        for key in [k for k in self._cache if k[0] == group and queue in (None, k[1])]:
            del self._cache[key]
        return reply.removed

    async def _admin(self, method: str, request: Any) -> Any:
        stub = self._stub()
        if stub is None:
            raise HandlerUnavailable("no LOCAL grouping handler is known in the cluster")
        try:
            return await getattr(stub, method)(
                request, timeout=self.config.timeout / 1000, wait_for_ready=True
            )
        except aio.AioRpcError as err:
            raise HandlerUnavailable(
                f"the LOCAL grouping handler at {self._target} failed: "
                f"{err.code().name}: {err.details()}"
            ) from None

    # ---- connection ---------------------------------------------------------------------

    def _proposal_stream(self) -> ProposalStream | None:
        """The open proposal stream to the LOCAL node the topology names now, or None."""
        stub = self._stub()
        if stub is None:
            return None
        if self._proposals is None or self._proposals.failure is not None:
            self._proposals = ProposalStream(stub)
        return self._proposals

    def _stub(self) -> pb_grpc.GroupingHandlerStub | None:
        """A stub on a channel to the LOCAL node the topology names now, or None.

        A new target closes the old channel, and with it the proposal stream on it.
        """
        target = self._locate()
        if target is None:
            return None
        if target != self._target or self._channel is None:
            if self._proposals is not None:
                self._proposals.close()
                self._proposals = None
            if self._channel is not None:
                closing = asyncio.get_running_loop().create_task(self._channel.close(grace=1.0))
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
            self._target = target
            self._channel = channels.dial(
                target,
                [
                    *channels.keepalive(),
                    *channels.reconnect(max(100, int(self._reconnect_s * 1000))),
                ],
                self.tls,
            )
            self._stub_ = pb_grpc.GroupingHandlerStub(self._channel)
        return self._stub_

    # ---- removals -----------------------------------------------------------------------

    async def _removals_loop(self) -> None:
        """Keep one Removals stream open to the LOCAL node; validate the cache on each start."""
        request = pb.RemovalsRequest(node=self.node_id)
        while True:
            stub = self._stub()
            if stub is not None:
                call = stub.Removals(request)
                validating: asyncio.Task[None] | None = None
                try:
                    async with asyncio.timeout(SILENCE_S):
                        metadata = await call.initial_metadata()
                    if metadata and metadata.get(SUBSCRIBED[0]) == SUBSCRIBED[1]:
                        self.subscribed.set()
                        log.info("removals stream connected", local=self._target)
                        validating = asyncio.create_task(self._validate())
                        stream = call.__aiter__()
                        while True:
                            async with asyncio.timeout(SILENCE_S):
                                removal = await anext(stream)
                            if not self._current(removal.arbiter_epoch):
                                break  # a fenced arbiter's stream: subscribe again
                            if removal.group:  # an empty one is a heartbeat
                                self._on_removal(removal)
                except (aio.AioRpcError, TimeoutError, StopAsyncIteration) as err:
                    if self.subscribed.is_set():
                        log.info("removals stream lost", local=self._target, error=repr(err))
                except asyncio.CancelledError:
                    if not _channel_closed():
                        raise
                    log.info("removals stream closed: the LOCAL node moved", local=self._target)
                finally:
                    self.subscribed.clear()
                    call.cancel()
                    if validating is not None:
                        validating.cancel()
            await asyncio.sleep(self._reconnect_s)

    def _on_removal(self, removal: pb.Removal) -> None:
        binding = to_binding(removal)
        key = binding.key
        entry = self._cache.get(key)
        if entry is not None and entry.binding == binding:
            del self._cache[key]
        flight = self._flights.get(key)
        if flight is not None:
            flight.removed.add(binding)
        self._notify([binding], PB_TO_REASON.get(removal.reason, RemovalReason.UNBOUND))

    async def _validate(self) -> None:
        """Drop every cached binding the LOCAL node does not hold (a removal we missed)."""
        entries = list(self._cache.values())
        for start in range(0, len(entries), TOUCH_BATCH):
            chunk = entries[start : start + TOUCH_BATCH]
            while not await self._send_touch(chunk, validate_only=True):
                await asyncio.sleep(self._reconnect_s)

    async def _send_touch(self, entries: list[_Cached], validate_only: bool) -> bool:
        """One Touch call; evicts what it names stale. False if the LOCAL node did not answer."""
        stub = self._stub()
        if stub is None:
            return False
        keys = [
            pb.Key(group=e.binding.group, queue=e.binding.queue, node=e.binding.node)
            for e in entries
        ]
        try:
            reply = await stub.Touch(
                pb.TouchRequest(keys=keys, validate_only=validate_only),
                timeout=self.config.timeout / 1000,
            )
        except aio.AioRpcError as err:
            log.debug("touch failed", local=self._target, error=err.details())
            return False
        if not self._current(reply.arbiter_epoch):
            return False
        stale: list[Binding] = []
        for k in reply.stale:
            entry = self._cache.get((k.group, k.queue))
            if entry is not None and entry.binding.node == k.node:
                del self._cache[(k.group, k.queue)]
                stale.append(entry.binding)
        self._notify(stale, RemovalReason.STALE)
        return True

    # ---- refreshing last use ------------------------------------------------------------

    async def _touch_loop(self) -> None:
        tick = max(self.config.group_timeout / 4, 5) / 1000
        while True:
            await asyncio.sleep(tick)
            try:
                await self.refresh()
            except Exception:
                log.exception("grouping touch failed")

    async def refresh(self) -> None:
        """Report bindings used since their last report, if that is group-timeout/2 ago."""
        half = self.config.group_timeout * _MS // 2
        now = self._clock()
        due: list[_Cached] = []
        keep: list[_Cached] = []
        cache = self._cache
        for entry in self._used:
            if cache.get(entry.binding.key) is not entry:
                continue  # evicted
            (due if now - entry.refreshed >= half else keep).append(entry)
        self._used = keep  # hits from now on land here
        for start in range(0, len(due), TOUCH_BATCH):
            chunk = due[start : start + TOUCH_BATCH]
            before = [e.refreshed for e in chunk]
            for entry in chunk:
                entry.used = False
                entry.refreshed = now
            if not await self._send_touch(chunk, validate_only=False):
                for entry, refreshed in zip(chunk, before, strict=True):
                    entry.refreshed = refreshed
                    if not entry.used and cache.get(entry.binding.key) is entry:
                        entry.used = True
                        self._used.append(entry)
                for entry in due[start + TOUCH_BATCH :]:
                    if not entry.used:
                        entry.used = True
                        self._used.append(entry)
                return


def _channel_closed() -> bool:
    """Did a CancelledError come from a call whose channel was closed for a new LOCAL address,
    rather than from cancelling the running task (stopping)?"""
    task = asyncio.current_task()
    return task is not None and not task.cancelling()
