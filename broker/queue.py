"""One queue's group semantics: the pure core of dispatch (no I/O, no clock of its own).

`Queue` is the queue's operations, as the broker core calls them. The parts it is built from:
- broker/group_state.py: a group's record and its state machine: UNOWNED, OWNED (pinned to one
  consumer), DETACHING (unpinned once its outstanding messages settle), each of them HELD or
  not (a clustered node delivers nothing of a group it has not confirmed); the transitions
  pin, detach, unpin, hold and unhold are listed there, and only they change a group's state;
- broker/dispatch.py: the run queues and the steps that deliver, settle and return messages
  (`Dispatcher`, which `Queue` extends);
- broker/paging.py: the messages that are on disk only, per group, and which to read back or
  spill.

Invariants kept after every operation (checked by the stateful tests):
- a group has unacknowledged messages at no more than one consumer (its owner);
- a consumer holds at most `prefetch` unacknowledged messages;
- within a group, messages are delivered in order, and a message returned to the queue goes
  back to the head of its group together with every later one its consumer still held;
- a group's state agrees with the facts: owned exactly when it has an owner, detaching only
  while messages of it are out, held or detaching never in a run queue.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Container, Sequence
from itertools import chain

from broker import lagging
from broker.budget import Meter
from broker.config import QueueConfig
from broker.dispatch import DEEP, Dispatcher
from broker.effects import Effects
from broker.group_state import HELD, Consumer, Group, by_key
from broker.grouping import group_key
from broker.info import ConsumerInfo, GroupInfo, LaggingGroup, QueueCounts
from broker.message import GROUP_SEQ_HEADER, Message
from broker.queue_stats import LATENCY_BOUNDS_NS


class QueueError(Exception):
    """A request the queue cannot honour; the message says why."""


class NoSuchGroup(QueueError):
    """The named group is not in the queue's group table."""


class Queue(Dispatcher):
    """A queue with Artemis / Qpid group semantics, driven by method calls and `now_ns`."""

    def __init__(
        self, name: str, address: str, settings: QueueConfig, meter: Meter | None = None
    ) -> None:
        super().__init__(name, settings, meter if meter is not None else Meter())
        self.address = address
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

    def counts(self) -> QueueCounts:
        """For metrics: figures kept as messages move, so a scrape walks no group (only the
        consumers, and the held groups, which are few but for a moment after a restart)."""
        owned = sum(len(c.groups) for c in self._consumers.values())
        # At most every consumer's prefetch: a walk at scrape time, not a count per message.
        out_bytes = sum(m.size for c in self._consumers.values() for m in c.unacked.values())
        held_idle = sum(
            1 for g in self._held if g.owner is None and g.pending is None and not g.page
        )
        # The oldest: out to some consumer (each one's first delivery), ungrouped, or at the
        # head of the group that waited longest (bounded: broker/lagging.py).
        heads = [next(iter(c.unacked.values())) for c in self._consumers.values() if c.unacked]
        if self._ungrouped:
            heads.append(self._ungrouped[0])
        times = [m.enqueued_ns for m in heads]
        _, aged = self.lagging(1)
        times += [g.oldest_ns for g in aged if g.oldest_ns]
        return QueueCounts(
            pending=self._pending + self.paged,
            in_flight=self._outstanding,
            paged=self.paged,
            consumers=len(self._consumers),
            groups=len(self._groups),
            owned=owned,
            unowned_waiting=len(self._groups) - owned - held_idle,
            held=len(self._held),
            memory_bytes=self._mem_bytes,
            in_flight_bytes=out_bytes,
            oldest_ns=min(times, default=0),
        )

    def lagging(self, k: int) -> tuple[list[LaggingGroup], list[LaggingGroup]]:
        """The top `k` groups by backlog and by the age of their oldest waiting message
        (broker/lagging.py): bounded work, whatever the number of groups."""
        scan = 4 * k + 16
        runs = [self._unowned, *(c.ready for c in self._consumers.values())]
        heads_of = (lagging.heads(run, scan) for run in runs)
        return lagging.rank(chain(self._deep, *heads_of, lagging.waiting(self._held, scan)), k)

    def groups(self) -> list[GroupInfo]:
        return [
            GroupInfo(
                group=g.key,
                owner=g.owner.id if g.owner else None,
                owner_name=g.owner.name if g.owner else None,
                pending=g.backlog(),
                outstanding=g.outstanding,
                last_use_ns=g.last_use_ns,
                # The front of its waiting messages is the oldest: paged ones are newer.
                oldest_pending_ns=g.pending[0].enqueued_ns if g.pending else 0,
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
                delivered=c.delivered,
                acked=c.acked,
            )
            for c in self._consumers.values()
        ]

    def has_group(self, group: str) -> bool:
        """The group is known here: it has messages (waiting, paged or at a consumer), an
        owner, or is held."""
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
        """Queue a message; True if it was paged instead (kept on disk only, see
        broker/paging.py): because `may_page` (its address is full under PAGE), or because
        older messages of its group are."""
        self.totals.enqueued += 1
        message.group = key = group_key(self.settings, message.headers)
        message.group_seq = _parse_seq(message.headers.get(GROUP_SEQ_HEADER))
        if key is None:
            g = None
            if may_page or self._paging.ungrouped:
                self._paging.add(None, message)
                return True
        else:
            g = self._groups.get(key)
            if g is None:
                g = self._groups[key] = Group(key)
            g.last_use_ns = now_ns
            if may_page or g.page:
                self._paging.add(g, message)
                n = g.backlog()
                if n >= DEEP and not n & (n - 1):  # doubled: a candidate for the lagging
                    self._deepen(g)
                return True
        self._keep(g, message)
        self._pump(now_ns, fx)
        return False

    def restore_paged(self, group: str, msg_ids: array, enqueued_ns: int) -> None:
        """Stored messages of `group` at start-up, by their ids (ascending): paged."""
        self.totals.enqueued += len(msg_ids)
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = Group(group)
        g.last_use_ns = enqueued_ns
        self._paging.add_ids(g, msg_ids)
        if g.backlog() >= DEEP:
            self._deepen(g)

    # ---- paging (broker/paging.py) ------------------------------------------------------

    @property
    def paged(self) -> int:
        """Messages on disk only, in all."""
        return self._paging.count

    @property
    def page_last(self) -> int:
        """The msg id of the newest paged message (0: none yet)."""
        return self._paging.last

    def wanted(self, most: int, each: int) -> list[tuple[str | None, list[int]]]:
        """Up to `most` groups to read back now, with the msg ids of up to `each` of their
        oldest paged messages: groups with paged messages and none in memory that could be
        delivered (an owner with credit, or no owner: only while some consumer has credit)
        or are held (to be moved on, or kept); group None: the ungrouped messages, when none
        waits in memory and some consumer has credit."""
        return self._paging.wanted(most, each, self._hungry, self._held, bool(self._ungrouped))

    def spill(self, writing: Container[int], wanted_bytes: int) -> list[Message]:
        """Page again the newest waiting messages of groups that cannot move now (their owner
        has no credit), until `wanted_bytes` are freed; returns them.

        Memory then goes to groups that can be delivered (`wanted`) instead of waiting behind
        a stuck consumer's backlog. Only messages already on disk (not in `writing`, the msg
        ids whose store write is not committed yet), persistent and never delivered go: the
        store holds them exactly as they are.
        """
        out = self._paging.spill(self._consumers.values(), self._hungry, writing, wanted_bytes)
        self._pending -= len(out)
        for m in out:
            self._uncount(m)
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
        g = None
        if group is not None:
            g = self._groups.get(group)
            if g is None:
                return False
        if not self._paging.read(g, msg_ids):
            return False
        for m in messages:
            m.group, m.group_seq = group, _parse_seq(m.headers.get(GROUP_SEQ_HEADER))
            self._keep(g, m)
        if g is not None and g.pending is None:
            if g.page:
                self._paging.want(g)
            else:
                self._forget_if_idle(g)
        self._pump(now_ns, fx)
        return True

    # ---- consumers ----------------------------------------------------------------------

    def subscribe(
        self, consumer_id: str, name: str, prefetch: int, now_ns: int, fx: Effects
    ) -> None:
        if prefetch < 1:
            raise QueueError(f"prefetch must be at least 1, got {prefetch}")
        if consumer_id in self._consumers:
            raise QueueError(f"consumer {consumer_id!r} is already subscribed to {self.name!r}")
        c = self._consumers[consumer_id] = Consumer(consumer_id, name, prefetch, now_ns)
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
        for g in by_key(c.groups):
            self._unpin(g)
        if not self._consumers:
            self._started = False
            self._first_consumer_ns = None
        self._pump(now_ns, fx)

    def ack(self, consumer_id: str, delivery_ids: Sequence[int], now_ns: int, fx: Effects) -> None:
        self._finish(consumer_id, delivery_ids, now_ns, fx, True)

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
        self._finish(consumer_id, delivery_ids, now_ns, fx, False)

    def _finish(
        self,
        consumer_id: str,
        delivery_ids: Sequence[int],
        now_ns: int,
        fx: Effects,
        acked: bool,
    ) -> None:
        """Take delivered messages from their consumer for good (acked, or rejected)."""
        c = self._settling(consumer_id, delivery_ids)
        self._progress(c, now_ns)
        into, latency = (fx.removed if acked else fx.dead), self.totals.to_ack
        settled = 0
        for did in delivery_ids:
            m = c.unacked.pop(did, None)
            if m is None:
                continue  # settled or returned already
            settled += 1
            self._outstanding -= 1
            into.append(m)
            if acked:  # its latency bucket, counted inline: this runs for every message
                waited = now_ns - m.enqueued_ns
                latency.counts[bisect_left(LATENCY_BOUNDS_NS, waited)] += 1
                latency.sum += waited
            self._uncount(m)
            self._settle(m, now_ns)
        if acked:
            c.acked += settled
        else:
            self.totals.dead_lettered += settled
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

    # ---- moving messages to other nodes (cluster/sending.py, cluster/claims.py) ----------

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
        Messages already delivered stay with their consumer. Holding a held group does nothing.
        """
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = Group(group)
        if not g.state & HELD:
            g.hold()
            self._held[g] = None

    def unhold(self, group: str, now_ns: int, fx: Effects) -> None:
        """The group is bound here after all: dispatch it again (nothing if it is not held)."""
        g = self._groups.get(group)
        if g is None or not g.state & HELD:
            return
        g.unhold()
        del self._held[g]
        if g.pending is not None:
            self._schedule(g)
        else:
            self._forget_if_idle(g)
        self._pump(now_ns, fx)

    def held_waiting(self, group: str) -> bool:
        """The group is on hold with messages waiting (one came back from a consumer)."""
        g = self._groups.get(group)
        return g is not None and g.pending is not None and g.state & HELD != 0

    def take_group(self, group: str, fx: Effects) -> list[Message]:
        """Remove a held group's waiting messages, in order, to move them to another node.

        Messages still at a consumer stay; if one comes back it waits, held, for the next move.
        Raises QueueError unless the group is held: a dispatching group never moves.
        """
        g = self._groups.get(group)
        if g is None or not g.state & HELD:
            raise QueueError(f"group {group!r} of queue {self.name!r} is not on hold")
        taken = list(g.pending or ())
        g.pending = None
        self._pending -= len(taken)
        for m in taken:
            self._uncount(m)
        fx.removed += taken
        if g.page:  # read back, held, to follow the rest
            self._paging.want(g)
        elif g.outstanding == 0:  # nothing left here: forgotten
            if g.owner is not None:
                g.unpin()
            del self._groups[group]
            del self._held[g]
        return taken

    # ---- the whole queue ----------------------------------------------------------------

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

    @property
    def bytes(self) -> int:
        """What the messages held in memory count for (walks them: for checks, not dispatch)."""
        return sum(m.size for m in self.held())

    def forget(self) -> None:
        """The queue is deleted: what it held no longer counts."""
        self.meter.add(-self.bytes)

    def _consumer(self, consumer_id: str) -> Consumer:
        c = self._consumers.get(consumer_id)
        if c is None:
            raise QueueError(f"queue {self.name!r} has no consumer {consumer_id!r}")
        return c

    def _settling(self, consumer_id: str, delivery_ids: Sequence[int]) -> Consumer:
        """Check a whole settle request before touching anything, so it is all or nothing.

        Ids already settled or returned are ignored (a release may take back later messages
        of the group); ids never issued are an error.
        """
        c = self._consumer(consumer_id)
        bad = [d for d in delivery_ids if not 0 < d < self._next_delivery]
        if bad:
            raise QueueError(f"unknown delivery id(s) {bad} on queue {self.name!r}")
        return c


def _parse_seq(raw: str | None) -> int:
    """Senders are checked (broker/validation.py); a value stored before that reads as 0."""
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError:
        return 0
    return value if -(2**63) <= value < 2**63 else 0
