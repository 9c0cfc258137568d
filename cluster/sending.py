"""The clustered send path (`broker/sending.py`'s SendPath): which queue instance each message
goes to, for gRPC and STOMP alike.

For an address the cluster does not cover, a message goes through `BrokerCore.send` exactly as
on a standalone node. On a clustered address every target queue of
the message (one for anycast, each queue for multicast) gets an instance `queue@node`:

- ungrouped (or no grouping handler covers the address): `ClusterMember.choose`;
- grouped: the grouping handler's binding of (group key, queue). A binding known without I/O
  (`cached`) routes at once; otherwise the node proposes what `choose` picks and awaits the
  decision (`decide`), which may take up to the handler's `timeout`.

`send_now` routes a batch synchronously when no decision is missing and answers None
otherwise, having changed nothing in the core. `send` first awaits every missing decision of
the batch, concurrently, and only then routes all of it: a batch is all or nothing and keeps
its order. A caller that must keep several batches in order (a SendStream, a STOMP
connection) awaits `send` before it routes the next one. A decision that does not come in
time fails the batch with `GroupingUnavailable` (gRPC UNAVAILABLE, STOMP ERROR), and nothing
of it is enqueued anywhere: a grouped message is never routed without its binding.

Messages a client sends again with an `_AMQ_DUPL_ID` this node accepted lately are dropped
before planning, as on a standalone node (`broker/unit.py`'s `Unit.route`): the node a
client sent to decides, and forwarded messages are never screened again.

Routing runs in the caller's unit of the engine, which commits it (STOMP gathers a read's
frames into one store write). With the node's audit log on, each message leaves a `routed`
event per instance it is routed to (`Unit.place` -> `AuditLog.routed`): `queue@node`, and for
a grouped one the binding (group, epoch) and whether this send proposed it, with how long the
decision took. The module
also moves ungrouped messages away from a queue that lost its consumers (ON_DEMAND
redistribution); grouped messages never move.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from broker import logs
from broker.clock import now_ns
from broker.config import QueueConfig
from broker.core import CoreError
from broker.engine import QueueView
from broker.grouping import group_key
from broker.message import Outgoing
from broker.unit import Placement, Unit
from cluster.bridge import SF_PREFIX
from cluster.local import LocalEngine
from cluster.member import ClusterMember
from cluster.topology import Instance
from handler.api import Binding, DecisionTimeout, GroupingHandler, HandlerUnavailable
from handler.bindings import BindingStoreError

log = logs.get("cluster")

Key = tuple[str, str]  # (group key, queue)
Target = tuple[str, str | None, Binding | None]  # (queue, node, binding); node None: this node


class GroupingUnavailable(CoreError):
    """No grouping decision for a message in time (or no arbiter to make one): the send fails."""

    code = "unavailable"


class ClusteredSendPath:
    """The send path of a clustered node; both client shells call it through the seam."""

    def __init__(
        self, engine: LocalEngine, cluster: ClusterMember, handler: GroupingHandler | None
    ) -> None:
        self.engine = engine
        self.cluster = cluster
        self.handler = handler
        self.config = engine.config
        self.node_id = engine.config.node.id

    # ---- sending ----------------------------------------------------------------------------

    def send_now(self, batch: Sequence[Outgoing], unit: Unit, now_ns: int) -> list[int] | None:
        """Route the batch now; None (nothing done) when a grouping decision must be awaited.

        Raises CoreError (nothing done) when a message cannot be routed at all. Duplicates
        (`_AMQ_DUPL_ID`) are dropped first, on the node the client sent to (`Unit.route`).
        """

        def plan(fresh: Sequence[Outgoing]) -> list[list[Placement] | None] | None:
            targets = self._plan(fresh, None)
            return None if targets is None else self._placements(fresh, targets, {})

        return unit.route(batch, plan, now_ns)

    async def send(self, batch: Sequence[Outgoing], unit: Unit) -> list[int]:
        """Await the batch's missing decisions (concurrently), then route all of it.

        Duplicates are screened out before each plan, so none waits for a decision; the plan
        that is complete is routed with no await after its screening. A plan takes every
        binding from the handler as it is then (`cached`), not from the decisions awaited: one
        removed meanwhile (this node already told, `on_removed`) is decided again.
        """
        took: dict[Key, int] = {}  # how long each decision took (ns), for the audit log
        while True:
            missing: dict[Key, str] = {}

            def plan(
                fresh: Sequence[Outgoing], missing: dict[Key, str] = missing
            ) -> list[list[Placement] | None] | None:
                targets = self._plan(fresh, missing)
                return None if targets is None else self._placements(fresh, targets, took)

            ids = unit.route(batch, plan, now_ns())
            if ids is not None:
                return ids
            took.update(await self._decide(missing))

    def _plan(
        self,
        batch: Sequence[Outgoing],
        missing: dict[Key, str] | None,
    ) -> list[list[Target] | None] | None:
        """Targets of every message (None: the core's own routing), or None if one is missing.

        With `missing`, every missing decision of the batch is collected in it (key ->
        proposed node); without, planning stops at the first. Raises CoreError for a message
        that cannot be routed, before anything was enqueued.
        """
        cluster = self.cluster
        engine = self.engine
        handler = self.handler
        grouping = self.config.grouping_handler
        covers = cluster.config.covers
        me = self.node_id
        checked: set[str] = set()
        queues_of: dict[str, list[tuple[str, QueueConfig]]] = {}
        plan: list[list[Target] | None] = []
        for m in batch:
            address = m.address
            if not covers(address) or address.startswith(SF_PREFIX):
                if address not in checked:
                    engine.check_address(address)
                    checked.add(address)
                plan.append(None)
                continue
            queues = queues_of.get(address)
            if queues is None:
                queues = queues_of[address] = self._queues(cluster, address)
            grouped = grouping is not None and grouping.covers(address)
            targets: list[Target] = []
            for queue, settings in queues:
                key = group_key(settings, m.headers) if grouped else None
                binding: Binding | None = None
                if key is None or handler is None:
                    node = _node(cluster.choose(address, queue))
                else:
                    binding = handler.cached(key, queue)
                    if binding is None:
                        if missing is None:
                            return None
                        if (key, queue) not in missing:
                            proposal = _node(cluster.choose(address, queue))
                            missing[(key, queue)] = proposal or me
                        continue
                    node = None if binding.node == me else binding.node
                if node is None and address not in checked:
                    engine.check_address(address)  # enqueued here: may it be (auto-created)?
                    checked.add(address)
                targets.append((queue, node, binding))
            plan.append(targets)
        return None if missing else plan

    def _queues(self, cluster: ClusterMember, address: str) -> list[tuple[str, QueueConfig]]:
        """The queues a message to a clustered `address` goes to, with the settings that key it.

        Multicast: every queue of the address known in the cluster. Anycast: the address's one
        queue (the local one if it exists, else the one other nodes have, else the address
        name, auto-created); each queue name keys its groups the same way on every node.
        """
        local = {q.name: q.settings for q in self.engine.queues_of(address)}
        remote = {
            i.queue for i in cluster.topology.instances(address, include_down=True) if not i.local
        }
        declared = self.config.addresses.get(address)
        if declared is not None and declared.routing_type == "multicast":
            names = sorted(local.keys() | remote)
        elif local:
            names = [next(iter(local))]
        else:
            names = [min(remote)] if remote else [address]
        default: QueueConfig | None = None
        queues: list[tuple[str, QueueConfig]] = []
        for name in names:
            settings = local.get(name)
            if settings is None:
                default = default or self.config.queue_config_for(address)
                settings = default
            queues.append((name, settings))
        return queues

    def _placements(
        self, batch: Sequence[Outgoing], plan: list[list[Target] | None], took: dict[Key, int]
    ) -> list[list[Placement] | None]:
        """Where each message goes, as planned; `took`: decisions awaited for this batch (ns).

        A decision's time goes with the first message routed by it (the group's first here).
        """
        forwarding = self.cluster.forwarding
        me = self.node_id
        out: list[list[Placement] | None] = []
        for m, targets in zip(batch, plan, strict=True):
            if targets is None:
                out.append(None)
                continue
            places: list[Placement] = []
            for queue, node, binding in targets:
                p = Placement(queue, m) if node is None else forwarding(node, queue, m)
                p.target = (queue, node or me)
                p.binding = binding
                if took and binding is not None:
                    p.decision_ns = took.pop(binding.key, None)
                places.append(p)
            out.append(places)
        return out

    async def _decide(self, missing: dict[Key, str]) -> dict[Key, int]:
        """Every missing decision, concurrently; how long each took (ns).

        Raises GroupingUnavailable if any does not come.
        """
        handler, cluster = self.handler, self.cluster
        assert handler is not None
        grouping = self.config.grouping_handler
        # A LOCAL node that sees another LOCAL handler must not decide: two arbiters could
        # bind one group twice. (A REMOTE node finds no arbiter to ask and times out.)
        if (
            grouping is not None
            and grouping.type == "LOCAL"
            and not cluster.topology.local_handler()
        ):
            group, queue = next(iter(missing))
            raise GroupingUnavailable(
                f"no grouping decision for group {group!r} on queue {queue!r}: "
                f"{'; '.join(cluster.problems())}; new groups are refused until the "
                "cluster has exactly one"
            )
        keys = list(missing)

        async def timed(group: str, queue: str) -> int:
            start = time.perf_counter_ns()
            await handler.decide(group, queue, missing[(group, queue)])
            return time.perf_counter_ns() - start

        answers = await asyncio.gather(
            *(timed(group, queue) for group, queue in keys), return_exceptions=True
        )
        took: dict[Key, int] = {}
        for key, answer in zip(keys, answers, strict=True):
            if isinstance(answer, DecisionTimeout | HandlerUnavailable | BindingStoreError):
                raise GroupingUnavailable(str(answer))
            if isinstance(answer, BaseException):
                raise answer
            took[key] = answer
        return took

    # ---- redistribution ---------------------------------------------------------------------

    def redistribute_all(self) -> None:
        """`redistribute` every clustered queue (after a topology change, and now and then)."""
        for queue in self.engine.queues():
            if queue.ungrouped_pending and not queue.consumer_count:
                self.redistribute(queue)

    def redistribute(self, queue: QueueView) -> None:
        """ON_DEMAND: a queue without consumers hands its pending ungrouped messages to the
        instances of the same queue that have consumers, through their SF queues.

        Removing them here and adding them to the SF queue is one store write, so a crash
        keeps each message exactly once. Grouped messages stay: moving them could put a
        group at two consumers at once.
        """
        cluster = self.cluster
        if (
            cluster.config.load_balancing != "ON_DEMAND"
            or queue.consumer_count
            or not queue.ungrouped_pending
            or not cluster.config.covers(queue.address)
            or queue.name.startswith(SF_PREFIX)
        ):
            return
        busy = [
            i
            for i in cluster.topology.instances(queue.address)
            if not i.local and i.queue == queue.name and i.consumers > 0
        ]
        if not busy:
            return
        moved: dict[str, int] = {}
        with self.engine.unit() as unit:
            for m in unit.take_ungrouped(queue.name):
                node = _node(cluster.choose(queue.address, queue.name)) or busy[0].node
                unit.place(cluster.forwarding(node, queue.name, m.outgoing()))
                moved[node] = moved.get(node, 0) + 1
        log.info("ungrouped messages redistributed", queue=queue.name, to=moved)


def _node(instance: Instance | None) -> str | None:
    """The node to forward to, or None for this node."""
    return None if instance is None or instance.local else instance.node
