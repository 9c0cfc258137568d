"""Group claims: a clustered node delivers a group only once it knows the group is bound here.

A node may hold messages of a group whose binding has moved on: the node was away while the
LOCAL handler dropped its bindings (`rebind-absent-after`), an operator moved the group off it
(`reset-groups --cluster --force`), or the binding was reaped or unbound while messages of the
group waited here, or in another node's store-and-forward queue on their way here. Delivering
them would put the group at two consumers and out of order, so the node holds such a group
(`Queue.hold`: nothing more of it is delivered) until the grouping handler confirms where it
is bound, proposing this node, where the messages are:

- bound here: dispatch resumes, nothing moved;
- bound to another node: its waiting messages move there, in order, through that node's
  store-and-forward queue, each with an audit `moved` event and its delivery count; a
  message still at a consumer here moves once it comes back (released, or its consumer gone).

A node holds: every group restored from its store when it starts (before any consumer can
subscribe; paged groups too), a group whose binding to this node was removed, a group of a
forwarded message whose binding this node does not know or knows to be elsewhere, and every
group when its lease from the arbiter lapses (`rebind-absent-after`: it may be cut off while
its groups are bound elsewhere), ending the streams of consumers that hold their messages. A held
group's paged messages are read back, held, and move with it. Messages of a group
bound here are enqueued at once. Until the handler answers (the LOCAL node unreachable), held
groups wait, in order; other groups flow.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools

from broker import logs
from broker.config import GroupingHandlerSection, QueueConfig
from broker.core import CoreError
from broker.engine import QueueView
from broker.grouping import group_key
from broker.message import Outgoing
from broker.unit import Placement, Unit
from cluster.bridge import SF_PREFIX
from cluster.local import LocalEngine
from cluster.member import ClusterMember
from handler.api import Binding, DecisionTimeout, GroupingHandler, HandlerUnavailable, RemovalReason
from handler.bindings import BindingStoreError

log = logs.get("cluster")

Claim = tuple[str, str]  # (queue, group)
CHUNK = 5_000  # decisions asked for at once
RETRY_S = 0.5  # after the handler did not answer; also how often moved groups are looked at
_UNANSWERED = (DecisionTimeout, HandlerUnavailable, BindingStoreError)


class GroupClaims:
    """Holds the groups this node has not confirmed and settles them (see the module doc)."""

    def __init__(
        self,
        engine: LocalEngine,
        cluster: ClusterMember,
        handler: GroupingHandler,
        grouping: GroupingHandlerSection,
    ) -> None:
        self.engine = engine
        self.cluster = cluster
        self.handler = handler
        self.grouping = grouping
        self.node_id = cluster.node_id
        self._due: dict[Claim, None] = {}  # held, to be decided (an ordered set)
        self._draining: set[Claim] = set()  # moved away, with messages still at a consumer here
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._waiting = False  # "held groups wait" was logged

    # ---- lifecycle ----------------------------------------------------------------------

    def hold_restored(self) -> int:
        """Hold every group restored from the store; call before consumers can subscribe."""
        held, _ = self._hold_all()
        if held:
            log.info("restored groups held until their bindings are confirmed", groups=held)
        return held

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="group-claims")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ---- when to hold -------------------------------------------------------------------

    def removed(self, binding: Binding, reason: RemovalReason) -> None:
        """An `on_removed` callback: a binding to this node went away; hold what is left."""
        if binding.node != self.node_id:
            return
        q = self._queue(binding.queue)
        if q is None:
            return
        if self._governs(q.name, q.address, q.settings) and q.has_group(binding.group):
            with self.engine.unit() as unit:
                self._hold(q.name, binding.group, unit)

    def lapsed(self) -> None:
        """An `on_lease_lapsed` callback: this node may no longer deliver any group. Hold every
        group it governs, and end the streams of the consumers holding messages of one: their
        deliveries come back, held, before the arbiter may bind the group elsewhere."""
        groups, holding = self._hold_all()
        self.engine.end_consumers(
            holding, "this node lost its grouping lease: its deliveries of grouped messages void"
        )
        log.info("groups held: no grouping lease", groups=groups, consumers_ended=len(holding))

    def admit(self, queue: str, message: Outgoing, unit: Unit) -> int | None:
        """A forwarded message arrives: enqueued, held unless its group is known bound here."""
        q = self._queue(queue)
        address, headers = message.address, message.headers
        settings = q.settings if q is not None else self.engine.config.queue_config_for(address)
        key = group_key(settings, headers) if self._governs(queue, address, settings) else None
        binding = self.handler.cached(key, queue) if key is not None else None
        here = Placement(queue, message)
        if key is None or (binding is not None and binding.node == self.node_id):
            return unit.place(here)
        if q is not None:
            self._hold(queue, key, unit)  # before it is enqueued: nothing of it is delivered
        msg_id = unit.place(here)
        if q is None and msg_id is not None:  # a queue created just now has no consumer yet
            self._hold(queue, key, unit)
        return msg_id

    def _hold_all(self) -> tuple[int, set[str]]:
        """Hold every group this node governs; how many, and the consumers holding messages
        of one."""
        held, holding = 0, set()
        with self.engine.unit() as unit:
            for q in self.engine.queues():
                if self._governs(q.name, q.address, q.settings):
                    for info in q.groups():
                        self._hold(q.name, info.group, unit)
                        held += 1
                        if info.outstanding and info.owner is not None:
                            holding.add(info.owner)
        return held, holding

    def _hold(self, queue: str, group: str, unit: Unit) -> None:
        unit.hold(queue, group)
        self._due[(queue, group)] = None
        self._wake.set()

    def _governs(self, name: str, address: str, settings: QueueConfig) -> bool:
        return (
            settings.group_buckets != 0
            and not name.startswith(SF_PREFIX)
            and self.grouping.covers(address)
            and self.cluster.config.covers(address)
        )

    def _queue(self, name: str) -> QueueView | None:
        try:
            return self.engine.queue(name)
        except CoreError:
            return None

    # ---- settling -----------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            if not self._due:  # claims left unanswered last round are asked again at once
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RETRY_S if self._draining else None):
                        await self._wake.wait()
            self._wake.clear()
            for claim in list(self._draining):
                q = self._queue(claim[0])
                if q is None or not q.has_group(claim[1]):
                    self._draining.discard(claim)
                elif q.held_waiting(claim[1]):
                    self._due[claim] = None  # a message came back: decide again, move it
            unanswered: list[Claim] = []
            while self._due:
                claims = list(itertools.islice(self._due, CHUNK))
                for claim in claims:
                    del self._due[claim]
                answers = await asyncio.gather(
                    *(self.handler.decide(g, q, self.node_id) for q, g in claims),
                    return_exceptions=True,
                )
                unanswered += self._settle_all(claims, answers)
            if unanswered:  # asked again after a pause, with whatever was held meanwhile
                self._due.update(dict.fromkeys(unanswered))
                await asyncio.sleep(RETRY_S)

    def _settle_all(self, claims: list[Claim], answers: list[object]) -> list[Claim]:
        """Apply the decisions the handler still holds; returns the claims left without one.

        A binding removed while its answer was on the way (this node was told: `removed`) is
        not acted on: the group stays held and is decided again.
        """
        kept = moved = groups = 0
        failed: list[str] = []
        unanswered: list[Claim] = []
        for claim, answer in zip(claims, answers, strict=True):
            if isinstance(answer, Binding):
                queue, group = claim
                if self.handler.cached(group, queue) != answer:
                    self._due[claim] = None  # removed since it was answered: ask again
                elif answer.node == self.node_id:
                    kept += self._keep(claim)
                else:
                    count = self._move(claim, answer.node)
                    moved += count
                    groups += count > 0
            else:
                unanswered.append(claim)
                if not isinstance(answer, _UNANSWERED):
                    log.error(
                        "group claim failed", queue=claim[0], group=claim[1], error=repr(answer)
                    )
                failed.append(str(answer))
        if kept or moved:
            log.info("held groups settled", kept=kept, moved_groups=groups, moved_messages=moved)
        if failed and not self._waiting:
            log.warning(
                "held groups wait for the grouping handler", groups=len(failed), error=failed[0]
            )
        self._waiting = bool(failed)
        return unanswered

    def _keep(self, claim: Claim) -> int:
        queue, group = claim
        self._draining.discard(claim)
        if self._queue(queue) is None:
            return 0
        with self.engine.unit() as unit:
            unit.unhold(queue, group)
        return 1

    def _move(self, claim: Claim, node: str) -> int:
        """Send the held group's waiting messages to `node`; how many went."""
        queue, group = claim
        q = self._queue(queue)
        if q is None or not q.has_group(group):
            self._draining.discard(claim)
            return 0
        with self.engine.unit() as unit:  # taken here and put on their way in one store write
            try:
                taken = unit.take_group(queue, group, f"{queue}@{node}")
            except CoreError:  # no longer held: its binding came back here meanwhile
                return 0
            for m in taken:
                unit.place(self.cluster.forwarding(node, queue, m.outgoing()))
        if q.has_group(group):
            self._draining.add(claim)
        else:
            self._draining.discard(claim)
        return len(taken)
