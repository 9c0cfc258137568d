"""Dispatch: which consumer gets which message next; the steps `Queue` (broker/queue.py) drives.

Every group has its own FIFO of pending messages. A group with pending messages that may be
delivered (UNOWNED or OWNED and not held: broker/group_state.py) sits in exactly one run
queue: its owner's `ready` deque, or the queue-wide `unowned` deque when it has no owner.
Ungrouped messages have their own FIFO. Dispatch only ever looks at the heads of these deques,
so a blocked group never blocks anything behind it and the cost of dispatching a message does
not depend on how many groups exist.

A group that stops being deliverable (held, detaching, or drained) is not searched for in its
run queue: its entry goes stale. `Group.slot` names the one run queue where the group's entry
is live, and `_head` drops the stale entries it meets.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Sequence

from broker.budget import Meter, footprint
from broker.config import QueueConfig
from broker.effects import Delivery, Effects
from broker.group_state import DETACHING, OWNED, OWNERSHIP, UNOWNED, Consumer, Group
from broker.message import Message
from broker.paging import Paging
from broker.queue_stats import LATENCY_BOUNDS_NS, QueueTotals

# A group joins the candidates for the top lagging groups (broker/lagging.py) each time its
# backlog (in memory and paged) doubles from this on: a test per message, no walk of groups.
DEEP = 8
DEEP_CAP = 1024  # candidates kept at most, pruned to the deepest half beyond it: a scrape
# ranks at most these (and metrics.top-groups is at most half of it)


class Dispatcher:
    """A queue's groups, consumers and run queues, and the steps that move messages between
    them: keep, deliver, settle, return, and the group transitions they imply. `Queue` adds
    the operations; like it, no I/O and no clock of its own (time is passed in)."""

    def __init__(self, name: str, settings: QueueConfig, meter: Meter) -> None:
        self.name = name
        self.settings = settings
        self.meter = meter
        self._paging = Paging()
        self._groups: dict[str, Group] = {}
        self._consumers: dict[str, Consumer] = {}
        self._hungry: dict[Consumer, None] = {}  # consumers with credit (ordered set)
        self._dirty: deque[Consumer] = deque()  # consumers that may have ready groups and credit
        self._unowned: deque[Group] = deque()
        self._ungrouped: deque[Message] = deque()
        self._pending = 0  # messages in memory, waiting for a consumer
        self._outstanding = 0  # delivered, not settled
        self._mem_bytes = 0  # what its messages in memory count for, delivered or not
        self._held: dict[Group, None] = {}  # held groups, oldest hold first
        self._deep: dict[Group, None] = {}  # groups whose backlog grew past DEEP
        self.totals = QueueTotals()
        self._next_delivery = 1
        self._paused = False  # group-rebalance-pause-dispatch in progress
        # The states whose group is unpinned once nothing of it is out: shared groups move on.
        shared = settings.group_mode == "shared"
        self._unpin_idle = (OWNED | DETACHING) if shared else DETACHING
        threshold = settings.slow_consumer_threshold
        self._slow_ns = threshold * 1_000_000 if threshold >= 0 else -1
        self._started = False  # consumers-before-dispatch / delay-before-dispatch satisfied
        self._first_consumer_ns: int | None = None

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
        # Runs for every message: while dispatch runs (the common case), no call to find out.
        if (self._paused or not self._started) and not self._dispatching(now_ns):
            return
        dirty, hungry = self._dirty, self._hungry
        while True:
            while dirty:
                self._serve(dirty.popleft(), now_ns, fx)
            if not hungry or not self._give_shared(None, now_ns, fx):
                return

    def _serve(self, c: Consumer, now_ns: int, fx: Effects) -> None:
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
            self._deliver_head(g, c, now_ns, fx, False)

    def _give_shared(self, older_than: int | None, now_ns: int, fx: Effects) -> bool:
        """Hand out the oldest unowned group or ungrouped message, if older than `older_than`.

        A new group goes to the consumer with the fewest groups among those with credit that
        do not stall; ungrouped messages go round robin. Returns whether anything was delivered.
        """
        hungry, ungrouped, unowned = self._hungry, self._ungrouped, self._unowned
        g = self._head(unowned) if unowned else None  # runs per message: no call for nothing
        g_id = g.pending[0].msg_id if g is not None else None  # type: ignore[index]
        u_id = ungrouped[0].msg_id if ungrouped else None
        taker: Consumer | None = None
        if g_id is not None and (u_id is None or g_id <= u_id):
            if older_than is not None and g_id > older_than:
                return False
            # None: every consumer with credit stalls; the group waits, ungrouped work goes on.
            taker = self._taker(now_ns, fx)
        if taker is not None:
            unowned.popleft()
            g.slot = None  # type: ignore[union-attr]
            g.pin(taker)  # type: ignore[union-attr]
            self._deliver_head(g, taker, now_ns, fx, True)  # type: ignore[arg-type]
            return True
        if u_id is None or (older_than is not None and u_id > older_than):
            return False
        c = next(iter(hungry))
        del hungry[c]
        hungry[c] = None  # rotate: round robin over consumers for ungrouped messages
        self._pending -= 1
        self._deliver(c, None, ungrouped.popleft(), now_ns, fx, False)
        return True

    def _taker(self, now_ns: int, fx: Effects) -> Consumer | None:
        """Who gets a new group: the consumer with the fewest groups among those with credit
        that are not stalled (a stalled one is reported once in `fx.stalled`)."""
        best: Consumer | None = None
        for c in self._hungry:
            if self._slow(c, now_ns):
                if not c.stalled:
                    c.stalled = True
                    fx.stalled.append((self.name, c.name, len(c.unacked), now_ns - c.progress_ns))
            elif best is None or len(c.groups) < len(best.groups):
                best = c
        return best

    def _slow(self, c: Consumer, now_ns: int) -> bool:
        return self._slow_ns >= 0 and bool(c.unacked) and now_ns - c.progress_ns > self._slow_ns

    def _progress(self, c: Consumer, now_ns: int) -> None:
        c.progress_ns = now_ns
        c.stalled = False

    def _deliver_head(self, g: Group, c: Consumer, now_ns: int, fx: Effects, first: bool) -> None:
        """Deliver the group's oldest waiting message to its owner `c`; `first`: the delivery
        that pinned the group to `c`."""
        pending = g.pending
        assert pending
        m = pending.popleft()
        if not pending:
            g.pending = None
            if g.page:
                self._paging.want(g)
        self._pending -= 1
        self._deliver(c, g, m, now_ns, fx, first)
        if g.pending is not None and g.state == OWNED:
            self._push(c.ready, g, c)

    def _deliver(
        self, c: Consumer, g: Group | None, m: Message, now_ns: int, fx: Effects, first: bool
    ) -> None:
        did = self._next_delivery
        self._next_delivery = did + 1
        if not c.unacked:
            self._progress(c, now_ns)  # a stall is counted from the oldest unacked delivery
        c.unacked[did] = m
        c.delivered += 1
        self._outstanding += 1
        if m.delivery_count:
            self.totals.redelivered += 1
        else:  # its latency bucket, counted inline: this runs for every message
            waited = now_ns - m.enqueued_ns
            latency = self.totals.to_first_delivery
            latency.counts[bisect_left(LATENCY_BOUNDS_NS, waited)] += 1
            latency.sum += waited
        if g is not None:
            g.outstanding += 1
            g.last_use_ns = now_ns
            if m.group_seq < 0:  # closes the group once this message settles
                g.detach()
        if len(c.unacked) >= c.prefetch:
            self._hungry.pop(c, None)
        fx.deliveries.append(Delivery(did, c.id, m, first))

    def _head(self, run: deque[Group]) -> Group | None:
        """The first live entry of a run queue; stale entries are dropped on the way."""
        while run:
            g = run[0]
            if g.slot is run and g.pending is not None:
                return g
            run.popleft()
            if g.slot is run:
                g.slot = None
        return None

    def _push(self, run: deque[Group], g: Group, c: Consumer | None) -> None:
        """Append a deliverable group to a run queue (its owner's `c.ready`, or `unowned`)."""
        if g.slot is run:
            return
        g.slot = run
        run.append(g)
        if c is not None and not c.dirty and len(c.unacked) < c.prefetch:
            c.dirty = True
            self._dirty.append(c)

    def _schedule(self, g: Group) -> None:
        """Put a group that has pending messages where dispatch will find it, if its state
        lets it deliver (not held, not detaching)."""
        state = g.state
        if state == OWNED:
            self._push(g.owner.ready, g, g.owner)  # type: ignore[union-attr]
        elif state == UNOWNED:
            self._push(self._unowned, g, None)

    def _keep(self, g: Group | None, m: Message) -> None:
        """A message joins its group's FIFO in memory (g None: the ungrouped one), counted."""
        size = m.size or footprint(m)
        m.size = size
        meter = self.meter  # Meter.add, inlined: this runs for every message
        meter.bytes += size
        if meter.node is not None:
            meter.node.bytes += size
        self._mem_bytes += size
        self._pending += 1
        if g is None:
            self._ungrouped.append(m)
        elif g.pending is None:
            g.pending = deque((m,))
            self._schedule(g)
        else:
            pending = g.pending
            pending.append(m)
            n = len(pending) + len(g.page) if g.page else len(pending)
            if n >= DEEP and not n & (n - 1):
                self._deepen(g)

    def _deepen(self, g: Group) -> None:
        """A group's backlog doubled: a candidate for the top lagging groups."""
        deep = self._deep
        deep[g] = None
        if len(deep) > DEEP_CAP:  # amortised: at most once per DEEP_CAP / 2 new candidates
            live = [x for x in deep if self._groups.get(x.key) is x]
            live.sort(key=Group.backlog, reverse=True)
            self._deep = dict.fromkeys(live[: DEEP_CAP // 2])

    def _refill(self, c: Consumer) -> None:
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
            if g.outstanding == 0 and g.state & self._unpin_idle:
                self._unpin(g)
        if self._paused and self._outstanding == 0:
            self._paused = False

    def _return(
        self, c: Consumer, back: Sequence[tuple[int, Message]], now_ns: int, fx: Effects
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
                self.totals.dead_lettered += 1
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
            if g.backlog() >= DEEP:  # grew by more than one: no doubling seen on the way
                self._deepen(g)
        touched = dict.fromkeys(self._groups[m.group] for _, m in back if m.group is not None)
        for g in touched:
            g.last_use_ns = now_ns
            if g.outstanding == 0 and g.state & self._unpin_idle:
                self._unpin(g)
            elif g.pending is not None:
                self._schedule(g)
        if self._paused and self._outstanding == 0:
            self._paused = False

    def _detach(self, g: Group) -> None:
        """Reset-groups or a rebalance frees an owned group, now or once nothing is out."""
        if g.outstanding == 0:
            self._unpin(g)
        elif g.state & OWNERSHIP == OWNED:  # not detaching already
            g.detach()

    def _unpin(self, g: Group) -> None:
        """The group leaves its owner: what waits goes to whoever dispatch picks next, and a
        group with nothing left (nothing waiting, paged or out) is forgotten, held or not."""
        g.unpin()
        if g.pending is not None:
            self._schedule(g)
        elif g.outstanding == 0 and not g.page:
            del self._groups[g.key]
            if g.state:  # held
                del self._held[g]

    def _rebalance(self) -> None:
        for g in [g for g in self._groups.values() if g.owner is not None]:
            self._detach(g)
        if self.settings.group_rebalance_pause_dispatch and self._outstanding:
            self._paused = True

    def _forget_if_idle(self, g: Group) -> None:
        """Forget a group that holds nothing, is not held and belongs to no one."""
        if not (g.pending or g.page or g.outstanding or g.state):
            del self._groups[g.key]

    def _uncount(self, m: Message) -> None:
        meter = self.meter
        meter.bytes -= m.size
        if meter.node is not None:
            meter.node.bytes -= m.size
        self._mem_bytes -= m.size
