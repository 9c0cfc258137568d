"""A grouping decision overtaken by a removal is not acted on.

A node asks the grouping handler where a group goes and acts on the answer once it comes: the
send path enqueues the message (`cluster/sending.py`), the group claims release or move a held
group (`cluster/claims.py`). The binding can be removed while the answer is on its way (an
operator's `reset-groups --cluster`, the queue instance deleted) and another node can bind the
group elsewhere before this one acts; this node hears of the removal (`on_removed`) before it
acts. Acting on the old answer then delivers the group here while it is bound to another node:
two consumers at once. Each test holds back the bindings file's confirmations (as a slow disk
would), so the first decision waits on its write while the removal and the other node's
proposal overtake it.

An engine that is never started (its store opened on a temporary directory), a real
`ClusterMember` whose topology is fed by hand, and a real LOCAL handler on a real bindings file.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from handler_nodes import section
from waiting import until

from broker.config import NodeConfig
from broker.engine import Engine
from broker.message import GROUP_ID_HEADER, Outgoing
from cluster.bridge import sf_queue
from cluster.claims import GroupClaims
from cluster.member import ClusterMember
from cluster.sending import ClusteredSendPath
from cluster.topology import NodeState
from handler.api import HandlerUnavailable
from handler.local import LocalHandler
from handler.records import Binding

ME, OTHER = "n1", "n2"
GROUP = {GROUP_ID_HEADER: "g"}


@dataclass
class Node:
    engine: Engine
    cluster: ClusterMember
    handler: LocalHandler

    def depth(self, queue: str) -> int:
        return sum(q.depth for q in self.engine.queues() if q.name == queue)


@asynccontextmanager
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    """This node runs the LOCAL handler; OTHER has an idle instance of queue `orders`."""
    config = NodeConfig.model_validate(
        {
            "node": {"id": ME, "data-dir": str(tmp_path)},
            "cluster": {"address": "orders", "load-balancing": "ON_DEMAND"},
            "grouping-handler": {"type": "LOCAL", "address": "orders"},
        }
    )
    engine = Engine(config)
    engine.open()
    cluster = ClusterMember(engine)
    topology = cluster.topology
    topology.update(NodeState(ME, f"{ME}:7701", "LOCAL", {}, 1, 1))
    topology.update(NodeState(OTHER, f"{OTHER}:7701", "REMOTE", {"orders": {"orders": 0}}, 1, 1))
    topology.connected(OTHER)
    handler = LocalHandler(section("LOCAL", timeout=30_000), ME, tmp_path)
    await handler.start()
    try:
        yield Node(engine, cluster, handler)
    finally:
        await handler.stop()
        await engine.close()


def hold_confirmations(handler: LocalHandler, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """The bindings file confirms each write (stored at once) only once the event is set."""
    store = handler.bindings_store
    assert store is not None
    put, confirm = store.put, asyncio.Event()

    def held(bindings: Iterable[Binding]) -> asyncio.Future[None]:
        written = put(bindings)

        async def confirmed() -> None:
            await confirm.wait()
            await written

        return asyncio.ensure_future(confirmed())

    monkeypatch.setattr(store, "put", held)
    return confirm


async def overtake(node: Node) -> asyncio.Task[Binding]:
    """Once this node's proposal of `g` waits on its write: an operator unbinds `g` and OTHER
    proposes itself. Returns OTHER's decision, which lands once writes are confirmed."""
    handler = node.handler

    def bound() -> Binding | None:
        return handler.arbiter.lookup("g", "orders")

    await until("g proposed", bound)
    assert bound() == Binding("g", "orders", ME, 1)
    assert await handler.unbind("g") == 1
    other = asyncio.create_task(handler.decide("g", "orders", OTHER))
    await until("g proposed again", bound)
    return other


async def test_a_send_routes_by_the_binding_the_handler_holds_when_it_enqueues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with node(tmp_path) as n:
        confirm = hold_confirmations(n.handler, monkeypatch)
        sender = ClusteredSendPath(n.engine, n.cluster, n.handler)

        async def send() -> None:
            with n.engine.unit() as unit:
                await sender.send([Outgoing("orders", b"m1", GROUP, True)], unit)

        sending = asyncio.create_task(send())
        other = await overtake(n)
        confirm.set()
        assert await other == Binding("g", "orders", OTHER, 1)
        await sending
        assert (n.depth(sf_queue("pinmq", OTHER)), n.depth("orders")) == (1, 0)


async def test_a_held_group_is_not_released_by_a_decision_its_removal_overtook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with node(tmp_path) as n:
        grouping = n.engine.config.grouping_handler
        assert grouping is not None
        claims = GroupClaims(n.engine, n.cluster, n.handler, grouping)
        n.handler.on_removed(claims.removed)
        # A message of `g` forwarded here before anyone bound `g`: held until decided.
        with n.engine.unit() as unit:
            claims.admit("orders", Outgoing("orders", b"m1", GROUP, True), unit)
        assert unit.write is not None
        await unit.write
        confirm = hold_confirmations(n.handler, monkeypatch)
        claims.start()
        try:
            other = await overtake(n)
            confirm.set()
            assert await other == Binding("g", "orders", OTHER, 1)
            sf = sf_queue("pinmq", OTHER)
            await until("m1 moved to OTHER, where g is bound", lambda: n.depth(sf) == 1)
            assert n.depth("orders") == 0
        finally:
            await claims.stop()


async def test_a_held_group_is_asked_for_again_after_the_handler_did_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler unreachable when a held group is first decided (the LOCAL node killed):
    the claim is asked again after a pause, with no new hold to wake it, and settles once the
    handler answers. (A drill found it waiting until some other group was held.)"""
    async with node(tmp_path) as n:
        grouping = n.engine.config.grouping_handler
        assert grouping is not None
        claims = GroupClaims(n.engine, n.cluster, n.handler, grouping)
        with n.engine.unit() as unit:
            claims.admit("orders", Outgoing("orders", b"m1", GROUP, True), unit)
        assert unit.write is not None
        await unit.write
        decide, asked = n.handler.decide, []

        async def unreachable_once(group: str, queue: str, node_id: str) -> Binding:
            asked.append(group)
            if len(asked) == 1:
                raise HandlerUnavailable("the LOCAL grouping handler is unreachable")
            return await decide(group, queue, node_id)

        monkeypatch.setattr(n.handler, "decide", unreachable_once)
        claims.start()
        try:
            orders = n.engine.queue("orders")
            await until("g released once the handler answers", lambda: len(asked) >= 2)
            await until("g no longer held", lambda: not orders.held_waiting("g"))
            assert n.handler.arbiter.lookup("g", "orders") == Binding("g", "orders", ME, 1)
        finally:
            await claims.stop()
