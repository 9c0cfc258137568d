"""One queue's group semantics: the pure core of dispatch (no I/O, no clock of its own).

Every group has its own FIFO of pending messages. A group with pending messages sits in
exactly one run queue: its owner's `ready` deque, or the queue-wide `unowned` deque when it
has no owner. Ungrouped messages have their own FIFO. Dispatch only ever looks at the heads
of these deques, so a blocked group never blocks anything behind it and the cost of
dispatching a message does not depend on how many groups exist.

Invariants kept after every operation (checked by the stateful tests):
- a group has unacknowledged messages at no more than one consumer (its owner);
- a consumer holds at most `prefetch` unacknowledged messages;
- within a group, messages are delivered in order, and a message returned to the queue goes
  back to the head of its group together with every later one its consumer still held.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Container, Sequence

from broker.budget import Meter, footprint
from broker.config import QueueConfig
from broker.effects import Delivery, Effects
from broker.grouping import group_key
from broker.info import ConsumerInfo, GroupInfo
from broker.message import GROUP_SEQ_HEADER, Message


class QueueError(Exception):
    """A request the queue cannot honour; the message says why."""


class NoSuchGroup(QueueError):
    """The named group is not in the queue's group table."""


class Page:
    """The msg ids of a group's messages that are on disk only, oldest first: 8 bytes each.

    Reading back takes from the front (`front`, then `drop`); a spill puts older ids back
    in front (`push_front`).
    """

    __slots__ = ("ids", "pos")

    def __init__(self) -> None:
        self.ids = array("q")
        self.pos = 0  # ids before this were read back

    def __len__(self) -> int:
        return len(self.ids) - self.pos

    def append(self, msg_id: int) -> None:
        self.ids.append(msg_id)

    def front(self, n: int) -> list[int]:
        return self.ids[self.pos : self.pos + n].tolist()

    def drop(self, n: int) -> None:
        self.pos += n
        if self.pos > 4096 and self.pos * 2 > len(self.ids):  # amortised O(1) per id
            del self.ids[: self.pos]
            self.pos = 0

    def push_front(self, msg_ids: list[int]) -> None:
        """Older ids (ascending) go before the rest."""
        self.ids = array("q", msg_ids) + self.ids[self.pos :]
        self.pos = 0


class _Group:
    """Kept small on purpose: one of these lives for every pinned group, idle or not."""

    __slots__ = (
        "detach", "fresh", "held", "key", "last_use_ns", "outstanding", "owner", "page",
        "pending", "slot",
    )  # fmt: skip

    def __init__(self, key: str) -> None:
        self.key = key
        self.pending: deque[Message] | None = None  # None while empty: an empty deque is ~600 B
        self.page: Page | None = None  # its newest messages, on disk only (Queue._page)
        self.owner: _Consumer | None = None
        self.outstanding = 0
        self.last_use_ns = 0
        self.detach = False  # unpin once nothing is outstanding; deliver nothing meanwhile
        self.fresh = False  # next delivery is the first its owner gets of the group
        self.held = False  # deliver nothing until the node knows the group is bound here
        self.slot: deque[_Group] | None = None  # the run queue this group is in, if any


class _Consumer:
    __slots__ = (
        "closed", "dirty", "groups", "id", "name", "prefetch", "progress_ns", "ready", "stalled",
        "unacked",
    )  # fmt: skip

    def __init__(self, consumer_id: str, name: str, prefetch: int, now_ns: int) -> None:
        self.id = consumer_id
        self.name = name
        self.prefetch = prefetch
        self.unacked: dict[int, Message] = {}  # delivery id -> message, in delivery order
        self.groups: set[_Group] = set()
        self.ready: deque[_Group] = deque()
        self.dirty = False
        self.closed = False
        # Its last settle, or the delivery that ended a spell with nothing unacked: a consumer
        # holding messages without progress for longer than slow-consumer-threshold stalls.
        self.progress_ns = now_ns
        self.stalled = False  # reported as stalled (Effects.stalled) since its last progress


class Queue:
    """A queue with Artemis / Qpid group semantics, driven by method calls and `now_ns`."""

    def __init__(
        self, name: str, address: str, settings: QueueConfig, meter: Meter | None = None
    ) -> None:
        self.name = name
        self.address = address
        self.settings = settings
        self.meter = meter if meter is not None else Meter()
        # Paging (see `page`): messages on disk only, per group; ungrouped ones apart.
        self.paged = 0  # in all
        self.page_last = 0  # msg id of the newest paged message
        self._ungrouped_page = Page()
        self._wanting: dict[_Group, None] = {}  # groups with paged messages and none in memory
        self._groups: dict[str, _Group] = {}
        self._consumers: dict[str, _Consumer] = {}
        self._hungry: dict[_Consumer, None] = {}  # consumers with credit (ordered set)
        self._dirty: deque[_Consumer] = deque()  # consumers that may have ready groups and credit
        self._unowned: deque[_Group] = deque()
        self._ungrouped: deque[Message] = deque()
        self._pending = 0
        self._outstanding = 0
        self._next_delivery = 1
        self._paused = False  # group-rebalance-pause-dispatch in progress
        threshold = settings.slow_consumer_threshold
        self._slow_ns = threshold * 1_000_000 if threshold >= 0 else -1
        self._started = False  # consumers-before-dispatch / delay-before-dispatch satisfied
        self._first_consumer_ns: int | None = None
        # Auto-created with auto-delete-queues: deleted once empty and unused this long.
        self.idle_limit_ns: int | None = None

    # ---- inspection -------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Messages in the queue, delivered or not, that are not yet acknowledged."""
        return self._pending + self._outstanding + self.paged

    @property
    def consumer_count(self) -> int:
        return len(self._consumers)

    def groups(self) -> list[GroupInfo]:
        return [
            GroupInfo(
                group=g.key,
                owner=g.owner.id if g.owner else None,
                owner_name=g.owner.name if g.owner else None,
                pending=(len(g.pending) if g.pending else 0) + (len(g.page) if g.page else 0),
                outstanding=g.outstanding,
                last_use_ns=g.last_use_ns,
            )
            for g in self._groups.values()
        ]

    def consumers(self, now_ns: int) -> list[ConsumerInfo]:
        """Every consumer with what it holds, and for how long it has made no progress."""
        return [
            ConsumerInfo(
                consumer_id=c.id,
                name=c.name,
                prefetch=c.prefetch,
                unacked=len(c.unacked),
                groups=len(c.groups),
                stalled_ms=(now_ns - c.progress_ns) // 1_000_000 if self._slow(c, now_ns) else 0,
            )
            for c in self._consumers.values()
        ]

    def has_group(self, group: str) -> bool:
        """The group has messages here (waiting or at a consumer) or an owner."""
        return group in self._groups

    def consumer_groups(self, consumer_id: str) -> list[str]:
        return sorted(g.key for g in self._consumer(consumer_id).groups)

    def unacked(self, consumer_id: str) -> list[tuple[int, Message]]:
        return list(self._consumer(consumer_id).unacked.items())

    def group_key(self, headers: dict[str, str]) -> str | None:
        """The group a message belongs to here (see the module-level `group_key`)."""
        return group_key(self.settings, headers)

    @property
    def ungrouped_pending(self) -> int:
        """Ungrouped messages waiting for a consumer."""
        return len(self._ungrouped)

    # ---- operations -------------------------------------------------------------------

    def enqueue(self, message: Message, now_ns: int, fx: Effects, may_page: bool = False) -> bool:
        """Queue a message; True if it was paged instead (see `page`): because `may_page`
        (its address is full under PAGE), or because older messages of its group are."""
        message.group = key = group_key(self.settings, message.headers)
        message.group_seq = _parse_seq(message.headers.get(GROUP_SEQ_HEADER))
        if key is None:
            if may_page or self._ungrouped_page:
                self._page(None, message)
                return True
            self._count(message)
            self._pending += 1
            self._ungrouped.append(message)
        else:
            g = self._groups.get(key)
            if g is None:
                g = self._groups[key] = _Group(key)
            g.last_use_ns = now_ns
            if may_page or g.page:
                self._page(g, message)
                return True
            self._count(message)
            self._pending += 1
            if g.pending is None:
                g.pending = deque((message,))
                self._schedule(g)
            else:
                g.pending.append(message)
        self._pump(now_ns, fx)
        return False

    def _page(self, g: _Group | None, m: Message) -> None:
        """Keep a message on disk only (its store write is the caller's), as persistent.

        Paging is per group: from a group's first paged message on, every later one of the
        group is paged too until `unpage` has read them all back, or it would overtake them.
        A group with paged messages and none in memory waits in `wanted` to be read back.
        """
        m.persistent = True
        self.paged += 1
        self.page_last = m.msg_id
        if g is None:
            self._ungrouped_page.append(m.msg_id)
            return
        if g.page is None:
            g.page = Page()
        g.page.append(m.msg_id)
        if g.pending is None:
            self._wanting[g] = None

    def wanted(self, most: int, each: int) -> list[tuple[str | None, list[int]]]:
        """Up to `most` groups to read back now, with the msg ids of up to `each` of their
        oldest paged messages: groups with paged messages and none in memory that could be
        delivered (an owner with credit, or no owner) or are held (to be moved on); group
        None: the ungrouped messages, when none waits in memory. Nothing while no consumer
        has credit."""
        hungry = self._hungry
        out: list[tuple[str | None, list[int]]] = []
        if not hungry:  # nobody could take them (held groups wait for a consumer too)
            return out
        if self._ungrouped_page and not self._ungrouped:
            out.append((None, self._ungrouped_page.front(each)))
        for g in self._wanting:
            if len(out) >= most:
                break
            if g.held or g.owner is None or g.owner in hungry:
                out.append((g.key, g.page.front(each)))  # type: ignore[union-attr]
        return out

    def spill(self, writing: Container[int], wanted_bytes: int) -> list[Message]:
        """Page again the newest waiting messages of groups that cannot move now (their owner
        has no credit), until `wanted_bytes` are freed; returns them.

        Memory then goes to groups that can be delivered (`wanted`) instead of waiting behind
        a stuck consumer's backlog. Only messages already on disk (not in `writing`, the msg
        ids whose store write is not committed yet), persistent and never delivered go: the
        store holds them exactly as they are.
        """
        freed = 0
        out: list[Message] = []
        hungry = self._hungry
        for c in self._consumers.values():
            if c in hungry:
                continue
            for g in sorted(c.groups, key=_key):  # sets iterate by address: deterministic
                pending = g.pending
                if g.held or not pending:
                    continue
                spilled = 0
                while pending and freed < wanted_bytes:
                    m = pending[-1]
                    if not m.persistent or m.delivery_count or m.msg_id in writing:
                        break
                    pending.pop()
                    self._uncount(m)
                    out.append(m)
                    freed += m.size
                    spilled += 1
                if spilled:
                    self._pending -= spilled
                    self.paged += spilled
                    if g.page is None:
                        g.page = Page()
                    g.page.push_front([x.msg_id for x in reversed(out[-spilled:])])
                    if not pending:
                        g.pending = None
                        self._wanting[g] = None
                if freed >= wanted_bytes:
                    return out
        return out

    def unpage(
        self,
        group: str | None,
        msg_ids: Sequence[int],
        messages: Sequence[Message],
        now_ns: int,
        fx: Effects,
    ) -> bool:
        """Paged messages read back from the store (`msg_ids`, from `wanted`; `messages`,
        those of them found, oldest first) join their group in memory. False (nothing done)
        if the group's page no longer starts with `msg_ids`: another read or a deletion won."""
        g = self._groups.get(group) if group is not None else None
        page = self._ungrouped_page if group is None else (g.page if g is not None else None)
        if not page or page.front(len(msg_ids)) != list(msg_ids):
            return False
        page.drop(len(msg_ids))
        self.paged -= len(msg_ids)
        if g is not None:
            if not page:
                g.page = None
            self._wanting.pop(g, None)
        for m in messages:
            m.group, m.group_seq = group, _parse_seq(m.headers.get(GROUP_SEQ_HEADER))
            self._count(m)
            self._pending += 1
            if g is None:
                self._ungrouped.append(m)
            elif g.pending is None:
                g.pending = deque((m,))
                self._schedule(g)
            else:
                g.pending.append(m)
        if g is not None and g.pending is None:
            if g.page:
                self._wanting[g] = None
            else:
                self._drop_if_idle(g)
        self._pump(now_ns, fx)
        return True

    def subscribe(
        self, consumer_id: str, name: str, prefetch: int, now_ns: int, fx: Effects
    ) -> None:
        if prefetch < 1:
            raise QueueError(f"prefetch must be at least 1, got {prefetch}")
        if consumer_id in self._consumers:
            raise QueueError(f"consumer {consumer_id!r} is already subscribed to {self.name!r}")
        c = self._consumers[consumer_id] = _Consumer(consumer_id, name, prefetch, now_ns)
        if self._first_consumer_ns is None:
            self._first_consumer_ns = now_ns
        if self.settings.group_rebalance and len(self._consumers) > 1:
            self._rebalance()
        self._refill(c)
        self._pump(now_ns, fx)

    def close_consumer(self, consumer_id: str, now_ns: int, fx: Effects) -> None:
        """Unacked messages go back to the head of their groups in order; groups are freed."""
        c = self._consumers.pop(consumer_id, None)
        if c is None:
            return
        c.closed = True
        self._hungry.pop(c, None)
        self._return(c, list(c.unacked.items()), now_ns, fx)
        for g in sorted(c.groups, key=_key):  # sets iterate by address: keep it deterministic
            self._unpin(g)
        if not self._consumers:
            self._started = False
            self._first_consumer_ns = None
        self._pump(now_ns, fx)

    def ack(self, consumer_id: str, delivery_ids: Sequence[int], now_ns: int, fx: Effects) -> None:
        self._finish(consumer_id, delivery_ids, now_ns, fx, fx.removed)

    def release(
        self, consumer_id: str, delivery_ids: Sequence[int], now_ns: int, fx: Effects
    ) -> None:
        """Back to the head of the group, delivery count + 1.

        Every later message of the same group that the consumer still holds goes back with
        it, so the group is redelivered in order.
        """
        c = self._settling(consumer_id, delivery_ids)
        self._progress(c, now_ns)
        for did in sorted(delivery_ids):
            m = c.unacked.get(did)
            if m is None:
                continue  # settled or returned already
            if m.group is None:
                back = [(did, m)]
            else:
                back = [(d, x) for d, x in c.unacked.items() if d >= did and x.group == m.group]
            self._return(c, back, now_ns, fx)
        self._refill(c)
        self._pump(now_ns, fx)

    def reject(
        self, consumer_id: str, delivery_ids: Sequence[int], now_ns: int, fx: Effects
    ) -> None:
        """The consumer refuses the message: it goes to the dead-letter address or is dropped."""
        self._finish(consumer_id, delivery_ids, now_ns, fx, fx.dead)

    def _finish(
        self,
        consumer_id: str,
        delivery_ids: Sequence[int],
        now_ns: int,
        fx: Effects,
        into: list[Message],
    ) -> None:
        """Take delivered messages from their consumer for good (acked or rejected)."""
        c = self._settling(consumer_id, delivery_ids)
        self._progress(c, now_ns)
        for did in delivery_ids:
            m = c.unacked.pop(did, None)
            if m is None:
                continue  # settled or returned already
            self._outstanding -= 1
            into.append(m)
            self._uncount(m)
            self._settle(m, now_ns)
        self._refill(c)
        self._pump(now_ns, fx)

    def reset_groups(self, group: str | None, now_ns: int, fx: Effects) -> None:
        """Unpin one group or all of them; a group with messages out moves once they settle."""
        if group is None:
            targets = [g for g in self._groups.values() if g.owner is not None]
        else:
            g = self._groups.get(group)
            if g is None:
                raise NoSuchGroup(f"queue {self.name!r} has no group {group!r}")
            targets = [g] if g.owner is not None else []
        for g in targets:
            self._detach(g)
        self._pump(now_ns, fx)

    def take_ungrouped(self, fx: Effects) -> list[Message]:
        """Remove every pending ungrouped message, to move it to another node (redistribution).

        Grouped messages never leave: their order belongs to the group's one consumer.
        """
        taken = list(self._ungrouped)
        self._ungrouped.clear()
        self._pending -= len(taken)
        for m in taken:
            self._uncount(m)
        fx.removed += taken
        return taken

    def hold(self, group: str) -> None:
        """Deliver nothing more of `group` (created empty if new) until `unhold`.

        The clustered node holds a group whose binding it has not confirmed (after a restart,
        a removal, or for forwarded messages of a group it has not heard of): if the group is
        bound elsewhere, its messages must move there instead of reaching a consumer here.
        Messages already delivered stay with their consumer.
        """
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = _Group(group)
        g.held = True
        g.slot = None  # its entry in a run queue goes stale

    def unhold(self, group: str, now_ns: int, fx: Effects) -> None:
        """The group is bound here after all: dispatch it again."""
        g = self._groups.get(group)
        if g is None or not g.held:
            return
        g.held = False
        if g.pending is not None:
            self._schedule(g)
        else:
            self._drop_if_idle(g)
        self._pump(now_ns, fx)

    def held_waiting(self, group: str) -> bool:
        """The group is on hold with messages waiting (one came back from a consumer)."""
        g = self._groups.get(group)
        return g is not None and g.held and g.pending is not None

    def take_group(self, group: str, fx: Effects) -> list[Message]:
        """Remove a held group's waiting messages, in order, to move them to another node.

        Messages still at a consumer stay; if one comes back it waits, held, for the next move.
        Raises QueueError unless the group is held: a dispatching group never moves.
        """
        g = self._groups.get(group)
        if g is None or not g.held:
            raise QueueError(f"group {group!r} of queue {self.name!r} is not on hold")
        taken = list(g.pending or ())
        g.pending = None
        self._pending -= len(taken)
        for m in taken:
            self._uncount(m)
        fx.removed += taken
        if g.page:  # read back, held, to follow the rest
            self._wanting[g] = None
        elif g.outstanding == 0:
            if g.owner is not None:
                g.owner.groups.discard(g)
            del self._groups[group]
        return taken

    def tick(self, now_ns: int, fx: Effects) -> None:
        """Lets delay-before-dispatch expire."""
        if not self._started and self._pending:
            self._pump(now_ns, fx)

    def held(self) -> list[Message]:
        """Every message the queue holds, delivered or not (for deleting the queue)."""
        held = [m for c in self._consumers.values() for m in c.unacked.values()]
        held += self._ungrouped
        for g in self._groups.values():
            if g.pending:
                held += g.pending
        return held

    # ---- dispatch ---------------------------------------------------------------------

    def _dispatching(self, now_ns: int) -> bool:
        if self._paused:
            return False
        if self._started:
            return True
        s = self.settings
        if not self._consumers:
            return False
        enough = len(self._consumers) >= s.consumers_before_dispatch
        waited = (
            s.delay_before_dispatch >= 0
            and self._first_consumer_ns is not None
            and now_ns - self._first_consumer_ns >= s.delay_before_dispatch * 1_000_000
        )
        self._started = enough or waited
        return self._started

    def _pump(self, now_ns: int, fx: Effects) -> None:
        if not self._dispatching(now_ns):
            return
        dirty, hungry = self._dirty, self._hungry
        while True:
            while dirty:
                self._serve(dirty.popleft(), now_ns, fx)
            if not hungry or not self._give_shared(None, now_ns, fx):
                return

    def _serve(self, c: _Consumer, now_ns: int, fx: Effects) -> None:
        """Fill a consumer's credit, oldest first among its own groups and the shared work."""
        c.dirty = False
        while not c.closed and len(c.unacked) < c.prefetch:
            g = self._head(c.ready)
            if g is None:
                return
            if self._give_shared(g.pending[0].msg_id, now_ns, fx):  # type: ignore[index]
                continue
            c.ready.popleft()
            g.slot = None
            self._deliver_head(g, c, now_ns, fx)

    def _give_shared(self, older_than: int | None, now_ns: int, fx: Effects) -> bool:
        """Hand out the oldest unowned group or ungrouped message, if older than `older_than`.

        A new group goes to the consumer with the fewest groups among those with credit that
        do not stall; ungrouped messages go round robin. Returns whether anything was delivered.
        """
        hungry, ungrouped = self._hungry, self._ungrouped
        g = self._head(self._unowned)
        g_id = g.pending[0].msg_id if g is not None else None  # type: ignore[index]
        u_id = ungrouped[0].msg_id if ungrouped else None
        taker: _Consumer | None = None
        if g_id is not None and (u_id is None or g_id <= u_id):
            if older_than is not None and g_id > older_than:
                return False
            # None: every consumer with credit stalls; the group waits, ungrouped work goes on.
            taker = self._taker(now_ns, fx)
        if taker is not None:
            self._unowned.popleft()
            g.slot = None  # type: ignore[union-attr]
            c = taker
            c.groups.add(g)  # type: ignore[arg-type]
            g.owner = c  # type: ignore[union-attr]
            g.fresh = True  # type: ignore[union-attr]
            self._deliver_head(g, c, now_ns, fx)  # type: ignore[arg-type]
            return True
        if u_id is None or (older_than is not None and u_id > older_than):
            return False
        c = next(iter(hungry))
        del hungry[c]
        hungry[c] = None  # rotate: round robin over consumers for ungrouped messages
        self._pending -= 1
        self._deliver(c, None, ungrouped.popleft(), now_ns, fx)
        return True

    def _taker(self, now_ns: int, fx: Effects) -> _Consumer | None:
        """Who gets a new group: the consumer with the fewest groups among those with credit
        that are not stalled (a stalled one is reported once in `fx.stalled`)."""
        best: _Consumer | None = None
        for c in self._hungry:
            if self._slow(c, now_ns):
                if not c.stalled:
                    c.stalled = True
                    fx.stalled.append((self.name, c.name, len(c.unacked), now_ns - c.progress_ns))
            elif best is None or len(c.groups) < len(best.groups):
                best = c
        return best

    def _slow(self, c: _Consumer, now_ns: int) -> bool:
        return self._slow_ns >= 0 and bool(c.unacked) and now_ns - c.progress_ns > self._slow_ns

    def _progress(self, c: _Consumer, now_ns: int) -> None:
        c.progress_ns = now_ns
        c.stalled = False

    def _deliver_head(self, g: _Group, c: _Consumer, now_ns: int, fx: Effects) -> None:
        pending = g.pending
        assert pending
        m = pending.popleft()
        if not pending:
            g.pending = None
            if g.page:
                self._wanting[g] = None
        self._pending -= 1
        self._deliver(c, g, m, now_ns, fx)
        if g.pending is not None and not g.detach:
            self._push(c.ready, g, c)

    def _deliver(
        self, c: _Consumer, g: _Group | None, m: Message, now_ns: int, fx: Effects
    ) -> None:
        did = self._next_delivery
        self._next_delivery = did + 1
        if not c.unacked:
            self._progress(c, now_ns)  # a stall is counted from the oldest unacked delivery
        c.unacked[did] = m
        self._outstanding += 1
        first = False
        if g is not None:
            g.outstanding += 1
            g.last_use_ns = now_ns
            if g.fresh:
                first = True
                g.fresh = False
            if m.group_seq < 0:  # closes the group once this message settles
                g.detach = True
        if len(c.unacked) >= c.prefetch:
            self._hungry.pop(c, None)
        fx.deliveries.append(Delivery(did, c.id, m, first))

    def _head(self, run: deque[_Group]) -> _Group | None:
        """The first live entry of a run queue; stale entries are dropped on the way."""
        while run:
            g = run[0]
            if g.slot is run and g.pending is not None:
                return g
            run.popleft()
            if g.slot is run:
                g.slot = None
        return None

    def _push(self, run: deque[_Group], g: _Group, c: _Consumer | None) -> None:
        if g.slot is run or g.held:
            return
        g.slot = run
        run.append(g)
        if c is not None and not c.dirty and len(c.unacked) < c.prefetch:
            c.dirty = True
            self._dirty.append(c)

    def _schedule(self, g: _Group) -> None:
        """Put a group that has pending messages where dispatch will find it."""
        if g.owner is None:
            self._push(self._unowned, g, None)
        elif not g.detach:
            self._push(g.owner.ready, g, g.owner)

    def _refill(self, c: _Consumer) -> None:
        """After credit came back: make the consumer eligible again."""
        if c.closed or len(c.unacked) >= c.prefetch:
            return
        self._hungry[c] = None
        if c.ready and not c.dirty:
            c.dirty = True
            self._dirty.append(c)

    # ---- settling and returning ---------------------------------------------------------

    def _settle(self, m: Message, now_ns: int) -> None:
        """A delivered message left its consumer for good (acked or rejected)."""
        if m.group is not None:
            g = self._groups[m.group]
            g.outstanding -= 1
            g.last_use_ns = now_ns
            if g.outstanding == 0 and (g.detach or self.settings.group_mode == "shared"):
                self._unpin(g)
        if self._paused and self._outstanding == 0:
            self._paused = False

    def _return(
        self, c: _Consumer, back: Sequence[tuple[int, Message]], now_ns: int, fx: Effects
    ) -> None:
        """Put delivered messages back at the head of their groups, in delivery order."""
        per_group: dict[str | None, list[Message]] = {}
        limit = self.settings.max_delivery_attempts
        for did, m in back:
            del c.unacked[did]
            self._outstanding -= 1
            m.delivery_count += 1
            if m.group is not None:
                self._groups[m.group].outstanding -= 1
            if m.delivery_count >= limit:
                self._uncount(m)
                fx.dead.append(m)
            else:
                fx.updated.append(m)
                per_group.setdefault(m.group, []).append(m)
        for key, msgs in per_group.items():
            self._pending += len(msgs)
            if key is None:
                self._ungrouped.extendleft(reversed(msgs))
                continue
            g = self._groups[key]
            if g.pending is None:
                g.pending = deque(msgs)
            else:
                g.pending.extendleft(reversed(msgs))
        touched = dict.fromkeys(self._groups[m.group] for _, m in back if m.group is not None)
        for g in touched:
            g.last_use_ns = now_ns
            if g.outstanding == 0 and (g.detach or self.settings.group_mode == "shared"):
                self._unpin(g)
            elif g.pending is not None:
                self._schedule(g)
        if self._paused and self._outstanding == 0:
            self._paused = False

    def _detach(self, g: _Group) -> None:
        if g.outstanding == 0:
            self._unpin(g)
        else:
            g.detach = True
            g.slot = None  # its entry in the owner's run queue goes stale

    def _unpin(self, g: _Group) -> None:
        owner = g.owner
        if owner is not None:
            owner.groups.discard(g)
        g.owner = None
        g.detach = False
        g.fresh = False
        if g.pending is not None:
            self._push(self._unowned, g, None)
        elif g.outstanding == 0 and not g.page:
            del self._groups[g.key]

    def _rebalance(self) -> None:
        for g in [g for g in self._groups.values() if g.owner is not None]:
            self._detach(g)
        if self.settings.group_rebalance_pause_dispatch and self._outstanding:
            self._paused = True

    # ---- helpers ------------------------------------------------------------------------

    def _count(self, m: Message) -> None:
        size = m.size or footprint(m)
        m.size = size
        meter = self.meter  # Meter.add, inlined: this runs for every message
        meter.bytes += size
        if meter.node is not None:
            meter.node.bytes += size

    def _uncount(self, m: Message) -> None:
        meter = self.meter
        meter.bytes -= m.size
        if meter.node is not None:
            meter.node.bytes -= m.size

    @property
    def bytes(self) -> int:
        """What the messages held in memory count for (walks them: for checks, not dispatch)."""
        return sum(m.size for m in self.held())

    def forget(self) -> None:
        """The queue is deleted: what it held no longer counts."""
        self.meter.add(-self.bytes)

    def _drop_if_idle(self, g: _Group) -> None:
        """Forget a group that holds nothing and belongs to no one."""
        if not (g.pending or g.page or g.outstanding or g.held or g.owner is not None):
            self._wanting.pop(g, None)
            del self._groups[g.key]

    def _consumer(self, consumer_id: str) -> _Consumer:
        c = self._consumers.get(consumer_id)
        if c is None:
            raise QueueError(f"queue {self.name!r} has no consumer {consumer_id!r}")
        return c

    def _settling(self, consumer_id: str, delivery_ids: Sequence[int]) -> _Consumer:
        """Check a whole settle request before touching anything, so it is all or nothing.

        Ids already settled or returned are ignored (a release may take back later messages
        of the group); ids never issued are an error.
        """
        c = self._consumer(consumer_id)
        bad = [d for d in delivery_ids if not 0 < d < self._next_delivery]
        if bad:
            raise QueueError(f"unknown delivery id(s) {bad} on queue {self.name!r}")
        return c


def _key(g: _Group) -> str:
    return g.key


def _parse_seq(raw: str | None) -> int:
    """Senders are checked (broker/validation.py); a value stored before that reads as 0."""
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError:
        return 0
    return value if -(2**63) <= value < 2**63 else 0
