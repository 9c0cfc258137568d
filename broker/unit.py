"""A unit of work: the commands that change a node's core, applied together.

Everything above the engine changes a node through these commands (`Engine.unit()`): each
calls the pure core and keeps its Effects; `commit` carries them all out at once (audit, one
store write, deliveries in order: `Engine._apply`) and then tells the observers which queues'
consumers changed. A unit used as a context manager commits on exit, so no effect can be
forgotten; a shell that gathers the frames of one read into one store write (STOMP) keeps a
unit and commits it before it awaits anything.

Commit before the next await: the core changed when the command ran, and deliveries must
leave in the order the core produced them, which a unit held across an await while another
commits would break.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from broker.audit import AuditLog, RoutingBinding
from broker.clock import now_ns
from broker.config import QueueConfig
from broker.core import BrokerCore
from broker.effects import Effects
from broker.message import Message, Outgoing
from broker.streams import ConsumerStream, Outlets, Receipt, ReceiptFor

Write = asyncio.Future[None]
SettleKind = Literal["ack", "release", "reject"]
Apply = Callable[[Effects, list[ReceiptFor], dict[str, int] | None], Write | None]


@dataclass(slots=True)
class Placement:
    """One copy of a message as the send path places it on this node.

    `queue` takes `message`: its target queue here, or the internal queue that carries it to
    the target's node (`internal`: created with those settings when missing). `target`
    (queue, node), `binding` and `decision_ns` are the send path's routing decision, for the
    audit log's `routed` event (none for a message moved on).
    """

    queue: str
    message: Outgoing
    internal: QueueConfig | None = None
    target: tuple[str, str] | None = None
    binding: RoutingBinding | None = None
    decision_ns: int | None = None


# The targets of every message of a batch (None: the core's own routing), or None when a
# decision is missing; called with the messages that are no duplicates.
Plan = Callable[[Sequence[Outgoing]], Sequence[Sequence[Placement] | None] | None]


class Unit:
    """Commands whose Effects are applied together by `commit` (see the module doc)."""

    __slots__ = (
        "_apply", "_audit", "_changed", "_core", "_fx", "_marks", "_notify", "_outlets",
        "_receipts", "write",
    )  # fmt: skip

    def __init__(
        self,
        core: BrokerCore,
        outlets: Outlets,
        apply: Apply,
        notify: Callable[[str], None],
        audit: AuditLog | None,
    ) -> None:
        self._core = core
        self._outlets = outlets
        self._apply = apply
        self._notify = notify  # a queue's consumers changed: the observers hear it
        self._audit = audit
        self._fx: Effects | None = None
        self._receipts: list[ReceiptFor] = []
        self._marks: dict[str, int] | None = None
        self._changed: list[str] = []
        self.write: Write | None = None  # the last commit's store write, if it had one

    def __enter__(self) -> Unit:
        return self

    def __exit__(self, *_: object) -> None:
        self.commit()

    def commit(self) -> Write | None:
        """Carry out everything done since the last commit; returns its store write.

        Await it before confirming to a client what the commands did.
        """
        fx, receipts, marks, changed = self._fx, self._receipts, self._marks, self._changed
        write = None
        if fx is not None or receipts or marks:
            self._fx, self._marks = None, None
            if receipts:
                self._receipts = []
            write = self._apply(fx if fx is not None else Effects(), receipts, marks)
        if changed:
            self._changed = []
            for queue in dict.fromkeys(changed):
                self._notify(queue)
        self.write = write
        return write

    def _add(self, fx: Effects) -> None:
        if self._fx is None:
            self._fx = fx
        else:
            self._fx.merge(fx)

    # ---- consumers --------------------------------------------------------------------------

    def subscribe(
        self,
        queue: str,
        consumer_id: str,
        name: str,
        prefetch: int,
        outbound: asyncio.Queue | None = None,
        now: int | None = None,
    ) -> ConsumerStream:
        """A new consumer of `queue` and its stream; raises CoreError (nothing done) if refused.

        `outbound`: the queue its deliveries go to (a STOMP connection's, shared by its
        subscriptions); a new one by default.
        """
        core = self._core
        fx = core.subscribe(queue, consumer_id, name, prefetch, now_ns() if now is None else now)
        first_key = core.queue(queue).settings.group_first_key
        stream = (
            ConsumerStream(consumer_id, queue, first_key)
            if outbound is None
            else ConsumerStream(consumer_id, queue, first_key, outbound)
        )
        self._outlets.add(stream)
        self._add(fx)
        self._changed.append(queue)
        return stream

    def unsubscribe(self, stream: ConsumerStream, now: int | None = None) -> None:
        """The consumer leaves: what it held goes back to the head of its groups, in order."""
        self._outlets.remove(stream.consumer_id)
        when = now_ns() if now is None else now
        self._add(self._core.close_consumer(stream.queue, stream.consumer_id, when))
        self._changed.append(stream.queue)

    def settle(
        self,
        stream: ConsumerStream,
        kind: SettleKind,
        delivery_ids: Sequence[int],
        receipt: bool = False,
        now: int | None = None,
    ) -> None:
        """Ack, release or reject deliveries; `receipt`: confirm them on the stream once
        their outcome is stored, in order with its deliveries."""
        core, when = self._core, now_ns() if now is None else now
        if kind == "ack":
            fx = core.ack(stream.queue, stream.consumer_id, delivery_ids, when)
        elif kind == "release":
            fx = core.release(stream.queue, stream.consumer_id, delivery_ids, when)
        else:
            fx = core.reject(stream.queue, stream.consumer_id, delivery_ids, when)
        self._add(fx)
        if receipt:
            self._receipts.append((stream, Receipt(list(delivery_ids))))

    # ---- groups -----------------------------------------------------------------------------

    def reset_groups(self, queue: str, group: str | None, now: int | None = None) -> None:
        """Unpin one group of `queue` (or all): their next messages may go to any consumer."""
        self._add(self._core.reset_groups(queue, group, now_ns() if now is None else now))

    def hold(self, queue: str, group: str) -> None:
        """Deliver nothing more of a group until `unhold` (see `Queue.hold`)."""
        self._core.hold_group(queue, group)

    def unhold(self, queue: str, group: str, now: int | None = None) -> None:
        self._add(self._core.unhold_group(queue, group, now_ns() if now is None else now))

    def take_group(self, queue: str, group: str, to: str) -> list[Message]:
        """Take a held group's waiting messages out to move them to `to` (`queue@node`),
        audited as `moved`; raises CoreError unless the group is held."""
        taken, fx = self._core.take_group(queue, group)
        self._add(fx)
        if taken and self._audit is not None:
            self._audit.moved(taken, to)
        return taken

    def take_ungrouped(self, queue: str) -> list[Message]:
        """Take a queue's pending ungrouped messages out (see `Queue.take_ungrouped`)."""
        taken, fx = self._core.take_ungrouped(queue)
        self._add(fx)
        return taken

    # ---- messages ---------------------------------------------------------------------------

    def place(self, p: Placement, now: int | None = None) -> int | None:
        """Enqueue `p.message` into `p.queue`; its msg id, None if dropped (no queue may take
        it and there is no dead-letter address)."""
        core, when, m = self._core, now_ns() if now is None else now, p.message
        if p.internal is not None:
            self._add(core.ensure_internal_queue(p.queue, p.internal))
        msg_id, fx = core.deliver_to(p.queue, m, when)
        self._add(fx)
        if p.target is not None and self._audit is not None and msg_id is not None:
            queue, node = p.target
            self._audit.routed(msg_id, m.address, m.headers, queue, node, p.binding, p.decision_ns)
        return msg_id

    def mark(self, origin: str, seq: int) -> None:
        """Forwarded messages up to `seq` from `origin` are here: stored with them."""
        if self._marks is None:
            self._marks = {}
        self._marks[origin] = seq

    def route(self, messages: Sequence[Outgoing], plan: Plan | None, now: int) -> list[int] | None:
        """Route a client's batch, all or nothing; one msg id per message (the first copy's).

        `plan` places each message (None: the core routes every message by its address); it
        may answer None, and then nothing is done (a grouping decision to await). Messages
        whose `_AMQ_DUPL_ID` their address accepted lately are dropped first, and answered
        with their original's msg id (0 once the cache no longer holds it); the ids of the
        others are remembered and stored with them. Raises CoreError, before anything was
        enqueued, when a message cannot be routed.
        """
        core = self._core
        dropped = core.duplicates(messages)
        fresh = [m for m, drop in zip(messages, dropped, strict=True) if not drop]
        if not fresh:
            ids: list[int] = []
        elif plan is None:
            ids = _send_locally(core, fresh, now, self._add)
        else:
            placements = plan(fresh)
            if placements is None:
                return None
            ids = self._place_all(fresh, placements, now)
        fx = Effects()  # the duplicate ids, stored with the messages
        for m, msg_id in zip(fresh, ids, strict=True):
            core.accepted(m, msg_id, fx)
        if len(fresh) != len(messages):
            routed = iter(ids)
            ids = [
                core.dropped(m, fx) if drop else next(routed)
                for m, drop in zip(messages, dropped, strict=True)
            ]
        self._add(fx)
        return ids

    def _place_all(
        self,
        messages: Sequence[Outgoing],
        placements: Sequence[Sequence[Placement] | None],
        now: int,
    ) -> list[int]:
        ids: list[int] = []
        for m, targets in zip(messages, placements, strict=True):
            if targets is None:
                msg_id, fx = self._core.send(m, now)
                self._add(fx)
                ids.append(msg_id)
                continue
            first: int | None = None
            for p in targets:
                copy_id = self.place(p, now)
                if first is None:
                    first = copy_id
            ids.append(first or 0)
        return ids


def _send_locally(
    core: BrokerCore, batch: Sequence[Outgoing], now: int, add: Callable[[Effects], None]
) -> list[int]:
    """Every address checked first, so the batch is enqueued all or none."""
    if len(batch) > 1:
        for address in {m.address for m in batch}:
            core.check_address(address)
    ids: list[int] = []
    for m in batch:
        msg_id, fx = core.send(m, now)
        add(fx)
        ids.append(msg_id)
    return ids
