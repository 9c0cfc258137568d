"""The arbiter of clustered grouping: which queue instance (queue@node) owns a group. Pure code.

One arbiter runs on the LOCAL grouping-handler node. It accepts the first proposal for a key
`(group, queue)` and answers every later proposal with that binding, so the whole cluster
routes a group to one instance. A binding leaves only through `unbind` (operator), `reap`
(unused for longer than group-timeout), `drop_instance` (its queue instance was deleted) or
`expire_absent` (its instance has been missing from the topology for longer than the absent
timeout, when one is set; -1, the default of a node, keeps it for as long as its node is away,
so a group never moves behind the back of messages waiting for that node); after that the key
may be proposed again.

No I/O and no clock: every call that depends on time gets `now_ns`. Time seen by the arbiter
never goes backwards (a smaller `now_ns` counts as the largest seen so far), which keeps the
binding table in last-use order, so `reap` costs O(removed) instead of a scan of every binding.
"""

from __future__ import annotations

from collections.abc import Container, Iterable

from handler.records import Binding, Instance, Key

_MS = 1_000_000


class _Entry:
    """A binding plus its last use: the only per-binding object besides the key tuple."""

    __slots__ = ("binding", "last_use")

    def __init__(self, binding: Binding, last_use: int) -> None:
        self.binding = binding
        self.last_use = last_use


class Arbiter:
    """Bindings with their last use, the instances they point at, and which of those are absent.

    `group_timeout_ms` of -1 means bindings are never reaped. `absent_timeout_ms` is how long
    an instance may be missing before the bindings to it are dropped; -1 means never.
    """

    def __init__(self, epoch: int, group_timeout_ms: int, absent_timeout_ms: int) -> None:
        if group_timeout_ms < -1 or absent_timeout_ms < -1:
            raise ValueError("group_timeout_ms and absent_timeout_ms must be >= -1")
        self.epoch = epoch
        self.group_timeout_ms = group_timeout_ms
        self.absent_timeout_ms = absent_timeout_ms
        self._group_timeout_ns = group_timeout_ms * _MS if group_timeout_ms >= 0 else -1
        self._absent_timeout_ns = absent_timeout_ms * _MS if absent_timeout_ms >= 0 else -1
        self._clock = 0
        # Insertion order is last-use order (a touch moves the entry to the end) when reaping.
        self._entries: dict[Key, _Entry] = {}
        self._by_instance: dict[Instance, set[str]] = {}  # groups bound to queue@node
        self._present: set[Instance] = set()
        self._absent: dict[Instance, int] = {}  # instance -> absent since (ns)
        self._names: dict[str, str] = {}  # one str object per queue/node name

    def __len__(self) -> int:
        return len(self._entries)

    # ---- time ---------------------------------------------------------------------------

    def _now(self, now_ns: int) -> int:
        if now_ns > self._clock:
            self._clock = now_ns
        return self._clock

    # ---- decisions ----------------------------------------------------------------------

    def propose(self, group: str, queue: str, node: str, now_ns: int) -> tuple[Binding, bool]:
        """Accept queue@node for an unbound key, or return (and touch) the existing binding.

        The bool is True only when this call created the binding.
        """
        now = self._now(now_ns)
        key = (group, queue)
        entry = self._entries.get(key)
        if entry is not None:
            self._touch_entry(key, entry, now)
            return entry.binding, False
        names = self._names
        queue = names.setdefault(queue, queue)
        node = names.setdefault(node, node)
        binding = Binding(group, queue, node, self.epoch)
        self._add(binding, now)
        return binding, True

    def lookup(self, group: str, queue: str) -> Binding | None:
        """The binding of a key, without touching it."""
        entry = self._entries.get((group, queue))
        return entry.binding if entry is not None else None

    def use(self, group: str, queue: str, now_ns: int) -> Binding | None:
        """`lookup` and `touch` in one step: the LOCAL node's per-message fast path."""
        now = self._now(now_ns)
        key = (group, queue)
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._touch_entry(key, entry, now)
        return entry.binding

    def touch(self, keys: Iterable[Key], now_ns: int) -> int:
        """Mark keys as used now (unknown keys are ignored); returns how many were bound."""
        now = self._now(now_ns)
        entries = self._entries
        touched = 0
        for key in keys:
            entry = entries.get(key)
            if entry is not None:
                self._touch_entry(key, entry, now)
                touched += 1
        return touched

    def _touch_entry(self, key: Key, entry: _Entry, now: int) -> None:
        if self._group_timeout_ns >= 0 and entry.last_use != now:
            entries = self._entries
            del entries[key]
            entries[key] = entry  # to the end: the table stays in last-use order
        entry.last_use = now

    # ---- removals -----------------------------------------------------------------------

    def unbind(self, group: str, queue: str | None) -> list[Binding]:
        """Remove a group's binding on `queue`, or on every queue when `queue` is None."""
        if queue is not None:
            entry = self._entries.get((group, queue))
            return [self._remove(entry.binding)] if entry is not None else []
        found = [e.binding for (g, _), e in self._entries.items() if g == group]
        return [self._remove(b) for b in found]

    def drop_instance(self, queue: str, node: str) -> list[Binding]:
        """A queue instance was deleted: its bindings go, and so does its presence record."""
        instance = (queue, node)
        self._present.discard(instance)
        self._absent.pop(instance, None)
        return self._remove_instance(instance)

    def instance_seen(self, queue: str, node: str, present: bool, now_ns: int) -> None:
        """Topology report: queue@node exists now, or went missing (the absence clock starts)."""
        now = self._now(now_ns)
        instance = (queue, node)
        if present:
            self._present.add(instance)
            self._absent.pop(instance, None)
        else:
            self._present.discard(instance)
            self._absent.setdefault(instance, now)

    def expire_absent(self, now_ns: int, leased: Container[str] = ()) -> list[Binding]:
        """Drop bindings to instances absent for longer than the absent timeout, except those
        on the `leased` nodes (whose lease may still hold: they may be delivering).

        The instance stays marked absent, so a binding made to it later goes at the next call.
        """
        now = self._now(now_ns)
        limit = self._absent_timeout_ns
        if limit < 0:
            return []
        removed: list[Binding] = []
        for instance, since in self._absent.items():
            if now - since > limit and instance in self._by_instance and instance[1] not in leased:
                removed += self._remove_instance(instance)
        return removed

    def next_absent_expiry(self, leased: Container[str] = ()) -> int | None:
        """When `expire_absent` next has something to drop (ns), or None: lets a shell sleep.

        Instances on `leased` nodes are left out: their shell wakes when a lease runs out."""
        if self._absent_timeout_ns < 0:
            return None
        deadlines = [
            since + self._absent_timeout_ns
            for instance, since in self._absent.items()
            if instance in self._by_instance and instance[1] not in leased
        ]
        return min(deadlines) + 1 if deadlines else None

    def absent_nodes(self) -> set[str]:
        """Nodes with an absent instance that still has bindings."""
        return {instance[1] for instance in self._absent if instance in self._by_instance}

    def reap(self, now_ns: int) -> list[Binding]:
        """Remove bindings unused for longer than group-timeout (none when it is -1)."""
        now = self._now(now_ns)
        timeout = self._group_timeout_ns
        if timeout < 0:
            return []
        idle: list[Binding] = []
        for entry in self._entries.values():  # oldest use first
            if now - entry.last_use <= timeout:
                break
            idle.append(entry.binding)
        return [self._remove(b) for b in idle]

    # ---- state transfer -----------------------------------------------------------------

    def bindings(self) -> list[tuple[Binding, int]]:
        """Every binding with its last use (ns)."""
        return [(e.binding, e.last_use) for e in self._entries.values()]

    def restore(self, bindings: Iterable[Binding], now_ns: int) -> None:
        """Load bindings (e.g. from disk after a restart) as used now.

        Their instances count as absent from now on unless the topology already reported them
        present: a binding to an instance that does not show up within the absent timeout is
        dropped. A key that is already bound keeps its current binding.
        """
        now = self._now(now_ns)
        names = self._names
        for b in bindings:
            if b.key in self._entries:
                continue
            queue = names.setdefault(b.queue, b.queue)
            node = names.setdefault(b.node, b.node)
            binding = Binding(b.group, queue, node, b.epoch)
            self._add(binding, now)
            if binding.instance not in self._present:
                self._absent.setdefault(binding.instance, now)

    # ---- bookkeeping --------------------------------------------------------------------

    def _add(self, binding: Binding, now: int) -> None:
        self._entries[binding.key] = _Entry(binding, now)
        groups = self._by_instance.get(binding.instance)
        if groups is None:
            groups = self._by_instance[binding.instance] = set()
        groups.add(binding.group)

    def _remove(self, binding: Binding) -> Binding:
        del self._entries[binding.key]
        groups = self._by_instance[binding.instance]
        groups.discard(binding.group)
        if not groups:
            del self._by_instance[binding.instance]
        return binding

    def _remove_instance(self, instance: Instance) -> list[Binding]:
        groups = self._by_instance.pop(instance, None)
        if not groups:
            return []
        queue = instance[0]
        entries = self._entries
        return [entries.pop((group, queue)).binding for group in sorted(groups)]
