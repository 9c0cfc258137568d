"""The LOCAL grouping handler: the arbiter behind a durable store and a reaper.

Exactly one node of a cluster runs it. Its own node asks it directly (`cached` / `decide`);
REMOTE nodes ask over `pinmq.grouping.v1.GroupingHandler`, served from this class by
`handler/service.py` on the cluster's gRPC server. A new binding is written to
`<data-dir>/bindings.db` before anyone (caller or RPC) is told about it, and a concurrent
proposal for a key whose write is still in flight waits for that same write, so no answer ever
names a binding a crash could forget.

Removals (reaped, unbound, instance deleted, instance absent) are deleted from disk without
waiting (if a crash loses the delete, the binding comes back and is removed again later),
pushed to every `Removals` stream and to the `on_removed` callbacks.

A binding stays while its instance is absent (its node down, or not yet heard of after a
restart): the group's messages wait for that node, in order, and never move behind its back.
Only with `rebind-absent-after` set (ms; -1 = never, the default) does the reaper task drop
bindings to instances missing for longer than that; the returning node then finds those
groups bound elsewhere and moves their messages there (`cluster/claims.py`). A node may be
cut off rather than down, still serving its consumers: so with that setting REMOTE nodes
deliver grouped messages only while they hold a lease from this handler (`grant_lease`), and
the reaper drops a node's bindings only once its lease has certainly run out
(`handler/leases.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import structlog

from broker.config import GroupingHandlerSection
from handler.api import (
    LIST_LIMIT,
    BindingUse,
    DecisionTimeout,
    GroupingHandler,
    HandlerUnavailable,
    RemovalReason,
)
from handler.arbiter import Arbiter
from handler.bindings import FILE_NAME, BindingStore
from handler.leases import Leases
from handler.records import Binding, Key

log = structlog.get_logger(__name__)

MAX_REMOVAL_BACKLOG = 100_000  # a subscriber further behind is cut off (it resubscribes)
BoundTo = tuple[str, str, str]  # (group, queue, node): a binding as a REMOTE node holds it
_MS = 1_000_000


class Subscriber:
    """One Removals stream: its backlog, and whether it fell too far behind or must end."""

    __slots__ = ("closed", "event", "items", "node", "overflow")

    def __init__(self, node: str) -> None:
        self.node = node
        self.items: deque[tuple[Binding, RemovalReason]] = deque()
        self.event = asyncio.Event()
        self.overflow = False
        self.closed = False

    def push(self, removed: list[Binding], reason: RemovalReason) -> None:
        if self.overflow or self.closed:
            return
        if len(self.items) + len(removed) > MAX_REMOVAL_BACKLOG:
            self.overflow = True
            self.items.clear()
        else:
            self.items.extend((b, reason) for b in removed)
        self.event.set()


class LocalHandler(GroupingHandler):
    """The LOCAL grouping handler of one node (see the module docstring)."""

    def __init__(
        self,
        config: GroupingHandlerSection,
        node_id: str,
        data_dir: Path | str,
        *,
        epoch: int = 1,
        clock: Callable[[], int] = time.time_ns,
        lease_clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        super().__init__()
        self.config = config
        self.node_id = node_id
        self.path = Path(data_dir) / FILE_NAME
        self.arbiter = Arbiter(epoch, config.group_timeout, config.rebind_absent_after)
        self._clock = clock  # wall clock: last uses are listed as unix times
        self._lease_clock = lease_clock
        self.leases: Leases | None = None  # granted only with rebind-absent-after set
        self._store: BindingStore | None = None
        self._pending: dict[Key, asyncio.Future[None]] = {}  # key -> write of its new binding
        self._subscribers: set[Subscriber] = set()
        self._reaper: asyncio.Task[None] | None = None
        self.reaper_runs = 0  # reaper passes so far: how long it has watched, as a count
        self._wake: asyncio.Event | None = None
        self._reported: set[tuple[str, str]] = set()  # instances of the last snapshot

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Open the bindings file (BindingStoreError names it if unusable), restore, reap."""
        store = await asyncio.to_thread(BindingStore.open, self.path)
        try:
            restored = await asyncio.to_thread(store.load)
        except BaseException:
            await store.close()
            raise
        self.arbiter.restore(restored, self._clock())
        if self.config.rebind_absent_after >= 0:
            c = self.config
            self.leases = Leases(c.lease, c.lease_margin, self._lease_clock())
        self._store = store
        self._wake = asyncio.Event()
        self._reaper = asyncio.create_task(self._reap_loop(), name="grouping-reaper")
        log.info("LOCAL grouping handler started", path=str(self.path), bindings=len(restored))

    async def stop(self) -> None:
        """Stop reaping, end the Removals streams, close the file."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        for sub in self._subscribers:
            sub.closed = True
            sub.event.set()
        if self._store is not None:
            await self._store.close()
            self._store = None

    # ---- decisions ----------------------------------------------------------------------

    def cached(self, group: str, queue: str) -> Binding | None:
        if self._pending and (group, queue) in self._pending:
            return None  # not durable yet: the caller awaits decide()
        return self.arbiter.use(group, queue, self._clock())

    async def decide(self, group: str, queue: str, proposal_node: str) -> Binding:
        """The binding, durable; raises BindingStoreError if it could not be written."""
        binding, _ = await self.propose(group, queue, proposal_node)
        return binding

    async def propose(self, group: str, queue: str, node: str) -> tuple[Binding, bool]:
        """`decide` plus whether this proposal created the binding (the RPC's answer)."""
        store = self._require()
        key = (group, queue)
        stats, asked = self.stats, time.monotonic_ns()
        stats.proposals += 1
        binding, accepted = self.arbiter.propose(group, queue, node, self._clock())
        if accepted:
            stats.created += 1
            write = store.put([binding])
            self._pending[key] = write
            write.add_done_callback(functools.partial(self._written, key, binding))
        else:
            write = self._pending.get(key)
            if write is None:
                stats.decisions.observe(time.monotonic_ns() - asked)
                return binding, False
        try:
            async with asyncio.timeout(self.config.timeout / 1000):
                await asyncio.shield(write)
            stats.decisions.observe(time.monotonic_ns() - asked)
        except TimeoutError:
            stats.timeouts += 1
            raise DecisionTimeout(
                f"no grouping decision for group {group!r} on queue {queue!r} within "
                f"{self.config.timeout} ms: the bindings file {self.path} did not confirm the write"
            ) from None
        return binding, accepted

    def _written(self, key: Key, binding: Binding, write: asyncio.Future[None]) -> None:
        if self._pending.get(key) is write:
            del self._pending[key]
        if write.cancelled() or write.exception() is None:
            return
        # Nobody was told about it: forget it, so the next proposal starts over.
        log.error("binding not stored", group=key[0], queue=key[1], error=str(write.exception()))
        if self.arbiter.lookup(*key) is binding:
            self.arbiter.unbind(*key)

    @property
    def bindings_store(self) -> BindingStore | None:
        return self._store

    def _require(self) -> BindingStore:
        if self._store is None:
            raise HandlerUnavailable("the LOCAL grouping handler is not running")
        return self._store

    # ---- operators and topology ---------------------------------------------------------

    async def list_bindings(
        self, group: str | None = None, limit: int = LIST_LIMIT
    ) -> list[BindingUse]:
        listed = (
            BindingUse(b, last_use // _MS)
            for b, last_use in self.arbiter.bindings()
            if group is None or b.group == group
        )
        return list(itertools.islice(listed, limit or None))

    async def unbind(self, group: str, queue: str | None = None) -> int:
        self._require()
        removed = self.arbiter.unbind(group, queue)
        self._removed(removed, RemovalReason.UNBOUND)
        return len(removed)

    def instance_seen(self, queue: str, node: str, present: bool) -> None:
        self.arbiter.instance_seen(queue, node, present, self._clock())
        if not present and self._wake is not None:
            self._wake.set()  # the reaper sleeps until the earliest absence expiry

    def instance_deleted(self, queue: str, node: str) -> None:
        self._removed(self.arbiter.drop_instance(queue, node), RemovalReason.INSTANCE_DELETED)

    def report_instances(self, instances: Mapping[tuple[str, str], bool]) -> None:
        for (queue, node), present in instances.items():
            self.instance_seen(queue, node, present)
        # Only what a snapshot listed can vanish from one: a binding restored from disk whose
        # node has not been heard of yet must wait out the absent timeout instead.
        for queue, node in self._reported - instances.keys():
            self.instance_deleted(queue, node)
        self._reported = set(instances)

    def touch_keys(self, keys: Iterable[BoundTo], validate_only: bool) -> list[BoundTo]:
        """A REMOTE's bindings in use: touch those it has right; return the ones it has wrong."""
        stale: list[BoundTo] = []
        fresh: list[Key] = []
        lookup = self.arbiter.lookup
        for k in keys:
            group, queue, node = k
            binding = lookup(group, queue)
            if binding is None or binding.node != node:
                stale.append(k)
            elif not validate_only:
                fresh.append((group, queue))
        if fresh:
            self.arbiter.touch(fresh, self._clock())
        return stale

    def grant_lease(self, node: str) -> int:
        """A lease for a REMOTE node, in ms; 0: leases are off (no rebind-absent-after)."""
        self._require()
        if self.leases is None:
            return 0
        return self.leases.grant(node, self._lease_clock())

    def _leased(self) -> tuple[set[str], int | None]:
        """Absent nodes whose lease may still hold, and in how many ns the next one ends."""
        if self.leases is None:
            return set(), None
        now = self._lease_clock()
        leased = {n for n in self.arbiter.absent_nodes() if self.leases.holds(n, now)}
        end = self.leases.next_expiry(now) if leased else None
        return leased, (end - now if end is not None else None)

    # ---- removals -----------------------------------------------------------------------

    def _removed(self, removed: list[Binding], reason: RemovalReason) -> None:
        if not removed:
            return
        if self._store is not None:
            self._store.delete([b.key for b in removed]).add_done_callback(_log_failed_delete)
        for sub in self._subscribers:
            sub.push(removed, reason)
        log.info("bindings removed", reason=str(reason), count=len(removed))
        self.stats.removed(str(reason), len(removed))
        self._notify(removed, reason)

    def subscribe(self, node: str) -> Subscriber:
        sub = Subscriber(node)
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)

    @property
    def subscribers(self) -> list[str]:
        """The nodes that hear of removals now, one entry per Removals stream."""
        return sorted(sub.node for sub in self._subscribers)

    async def _reap_loop(self) -> None:
        """Reap every reaper-period; drop absent instances' bindings as soon as they expire."""
        assert self._wake is not None
        period = self.config.reaper_period * _MS
        next_reap = self._clock() + period
        while True:
            try:
                leased, lease_ends_in = self._leased()
                now = self._clock()
                wake_in = next_reap - now
                expiry = self.arbiter.next_absent_expiry(leased)
                if expiry is not None:
                    wake_in = min(wake_in, expiry - now)
                if lease_ends_in is not None:
                    wake_in = min(wake_in, lease_ends_in + 1)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0, wake_in) / 1e9):
                        await self._wake.wait()
                leased, _ = self._leased()
                now = self._clock()
                removed = self.arbiter.expire_absent(now, leased)
                self._removed(removed, RemovalReason.INSTANCE_ABSENT)
                if now >= next_reap:
                    self._removed(self.arbiter.reap(now), RemovalReason.REAPED)
                    self.reaper_runs += 1
                    next_reap = now + period
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stop reaping for good
                log.exception("grouping reaper failed")
                await asyncio.sleep(self.config.reaper_period / 1000)


def _log_failed_delete(write: asyncio.Future[None]) -> None:
    if not write.cancelled() and write.exception() is not None:
        log.warning("binding removal not stored", error=str(write.exception()))
