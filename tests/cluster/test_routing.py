"""Clustered load balancing: the Router's policies and round robin, and ClusterMember.choose."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ports import reserve_port
from waiting import until

from broker.client import Client
from broker.config import NodeConfig
from broker.message import Outgoing
from cluster.routing import Router
from cluster.topology import Instance, NodeState, Topology
from pinmq.node import Node

ME = "n1"


def inst(node: str, consumers: int = 0, queue: str = "q") -> Instance:
    return Instance(queue, node, consumers, node == ME, "a")


def spread(router: Router, instances: list[Instance], policy: str, n: int) -> Counter[str]:
    return Counter(str(router.choose("a", instances, policy, ME)) for _ in range(n))  # type: ignore[arg-type]


def test_off_routes_to_the_local_instance_only() -> None:
    router = Router()
    instances = [inst("n1"), inst("n2", 5), inst("n3", 5)]
    assert spread(router, instances, "OFF", 10) == {"q@n1": 10}


def test_off_without_a_local_instance_means_create_it_locally() -> None:
    assert Router().choose("a", [inst("n2", 3)], "OFF", ME) is None


def test_off_round_robins_over_several_local_queues_of_the_address() -> None:
    router = Router()
    instances = [inst("n1", queue="q1"), inst("n1", queue="q2"), inst("n2", 1)]
    assert spread(router, instances, "OFF", 10) == {"q1@n1": 5, "q2@n1": 5}


def test_strict_round_robins_over_all_instances_whatever_their_consumers() -> None:
    router = Router()
    instances = [inst("n1"), inst("n2", 3), inst("n3")]
    picks = [str(router.choose("a", instances, "STRICT", ME)) for _ in range(6)]
    assert picks == ["q@n1", "q@n2", "q@n3"] * 2


def test_strict_with_no_instance_anywhere_goes_local() -> None:
    assert Router().choose("a", [], "STRICT", ME) is None


def test_on_demand_round_robins_over_local_and_remote_consumers_local_first() -> None:
    router = Router()
    instances = [inst("n1", 1), inst("n2", 10), inst("n3", 10)]
    picks = [str(router.choose("a", instances, "ON_DEMAND", ME)) for _ in range(6)]
    assert picks == ["q@n1", "q@n2", "q@n3"] * 2


def test_on_demand_round_robins_over_instances_with_consumers() -> None:
    router = Router()
    instances = [inst("n1"), inst("n2", 2), inst("n3"), inst("n4", 1)]
    assert spread(router, instances, "ON_DEMAND", 100) == {"q@n2": 50, "q@n4": 50}


def test_on_demand_without_consumers_anywhere_stays_local() -> None:
    router = Router()
    assert spread(router, [inst("n1"), inst("n2"), inst("n3")], "ON_DEMAND", 5) == {"q@n1": 5}
    assert router.choose("a", [inst("n2"), inst("n3")], "ON_DEMAND", ME) is None


def test_on_demand_follows_consumers_as_they_come_and_go() -> None:
    router = Router()
    remote_only = [inst("n1"), inst("n2", 1)]
    assert str(router.choose("a", remote_only, "ON_DEMAND", ME)) == "q@n2"
    local_too = [inst("n1", 1), inst("n2", 1)]
    assert spread(router, local_too, "ON_DEMAND", 4) == {"q@n1": 2, "q@n2": 2}
    nobody = [inst("n1"), inst("n2")]
    assert str(router.choose("a", nobody, "ON_DEMAND", ME)) == "q@n1"


def test_round_robin_positions_are_per_address() -> None:
    router = Router()
    instances = [inst("n1"), inst("n2")]
    assert str(router.choose("a", instances, "STRICT", ME)) == "q@n1"
    assert str(router.choose("b", instances, "STRICT", ME)) == "q@n1"
    assert str(router.choose("a", instances, "STRICT", ME)) == "q@n2"
    router.forget("a")
    assert str(router.choose("a", instances, "STRICT", ME)) == "q@n1"


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="policy"):
        Router().choose("a", [inst("n1")], "RANDOM", ME)  # type: ignore[arg-type]


def test_with_a_topology_disconnected_peers_get_nothing() -> None:
    topo = Topology(ME)
    for node, consumers in (("n1", 0), ("n2", 1), ("n3", 1)):
        topo.update(NodeState(node, f"{node}:1", None, {"a": {"q": consumers}}, 1, 1))
        topo.connected(node)
    topo.disconnected("n3", now_ns=5)
    router = Router()
    assert spread(router, topo.instances("a"), "ON_DEMAND", 10) == {"q@n2": 10}
    assert spread(router, topo.instances("a"), "STRICT", 10) == {"q@n1": 5, "q@n2": 5}


@given(
    consumers=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=6),
    rounds=st.integers(min_value=1, max_value=20),
    policy=st.sampled_from(["STRICT", "ON_DEMAND"]),
)
def test_distribution_is_even_over_the_eligible_instances(
    consumers: list[int], rounds: int, policy: str
) -> None:
    """Over k full rounds every eligible instance is chosen exactly k times, nobody else."""
    instances = [inst(f"n{i + 1}", c) for i, c in enumerate(consumers)]
    if policy == "STRICT":
        eligible = instances
    else:
        eligible = [i for i in instances if i.consumers > 0] or [instances[0]]
    counts = spread(Router(), instances, policy, rounds * len(eligible))
    assert counts == {str(i): rounds for i in eligible}


# ---- ClusterMember.choose on two in-process nodes ---------------------------------------------


def _config(
    tmp_path: Path, node_id: str, port: int, peer: int, bind: str = "127.0.0.1", **extra: Any
) -> NodeConfig:
    """`bind` other than 127.0.0.1: listen.cluster there, advertised as 127.0.0.1."""
    advertise = {"advertise": f"127.0.0.1:{port}"} if bind != "127.0.0.1" else {}
    return NodeConfig.model_validate(
        {
            "node": {"id": node_id, "data-dir": str(tmp_path / node_id)},
            "listen": {
                "client": f"127.0.0.1:{reserve_port()}",
                "stomp": f"127.0.0.1:{reserve_port()}",
                "http": f"127.0.0.1:{reserve_port()}",
                "cluster": f"{bind}:{port}",
            },
            "cluster": {
                **advertise,
                "address": "orders",
                "load-balancing": "STRICT",
                "connectors": [f"127.0.0.1:{peer}"],
                "reconnect-interval": 100,
            },
            **extra,
        }
    )


async def test_cluster_node_routes_over_gossiped_instances(tmp_path: Path) -> None:
    pa, pb = reserve_port(), reserve_port()
    # a binds a name and advertises its address: peers dial what it advertises.
    local = {"grouping-handler": {"type": "LOCAL"}}
    a = Node(_config(tmp_path, "a", pa, pb, bind="localhost", **local))
    b = Node(_config(tmp_path, "b", pb, pa, **{"grouping-handler": {"type": "REMOTE"}}))
    assert (a.config.listen.cluster, a.config.cluster_address) == (
        f"localhost:{pa}",
        f"127.0.0.1:{pa}",
    )
    await a.start()
    await b.start()
    try:
        ca, cb = a.cluster, b.cluster
        assert ca is not None and cb is not None
        seen: list[list[Instance]] = []
        ca.on_instances_changed(lambda topo: seen.append(topo.instances("orders")))
        async with Client(a.config.listen.client) as client_a:
            await client_a.create_queue("orders.q", address="orders")
            await client_a.create_queue("misc")
        async with Client(b.config.listen.client) as client_b:
            await client_b.create_queue("orders.q", address="orders")
            await client_b.create_queue("misc")  # not clustered: cluster.address is "orders"
            async with client_b.consumer("orders.q") as consumer:
                await consumer.start()
                await until(
                    "b's consumer to reach a",
                    lambda: bool(seen) and any(i.node == "b" and i.consumers for i in seen[-1]),
                )
        picks = [ca.choose("orders") for _ in range(4)]
        assert [(i.queue, i.node, i.local) for i in picks if i] == [
            ("orders.q", "a", True),
            ("orders.q", "b", False),
        ] * 2
        assert ca.choose("misc") is not None and ca.choose("misc").local  # type: ignore[union-attr]
        assert ca.choose("nothing.here") is None  # local, auto-created by the caller
        state_b = ca.topology.state("b")
        assert state_b is not None and set(state_b.instances) == {"orders"}
        # An SF queue is never advertised as a routing target.
        with a.engine.unit() as unit:
            unit.place(ca.forwarding("b", "orders.q", Outgoing("orders", b"x", {}, True)))
        async with Client(a.config.listen.client) as client_a:  # a change announced after it
            await client_a.create_queue("orders.later", address="orders")
        await until(
            "a to announce the queue created after the SF queue",
            lambda: any(i.queue == "orders.later" for i in ca.topology.instances("orders")),
        )
        assert all(not q.startswith("$") for q in ca.topology.state("a").instances)  # type: ignore[union-attr]
        # The grouping handlers found each other through gossip.
        assert ca.locate_local_handler() == f"127.0.0.1:{pa}"
        await until("b to learn a's handler", lambda: cb.locate_local_handler() is not None)
        assert cb.locate_local_handler() == f"127.0.0.1:{pa}"
        assert cb.topology.state("a").cluster_address == f"127.0.0.1:{pa}"  # type: ignore[union-attr]
        assert ca.problems() == cb.problems() == []
    finally:
        await b.stop(0)
        await a.stop(0)
