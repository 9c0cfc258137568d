"""Topology (pure) and gossip between real node processes on loopback."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cluster_nodes import NOT_YET
from conftest import NodeProcess
from ports import reserve_port

from broker.client import Client
from broker.config import NodeConfig
from cluster.connector import state_from_pb, state_to_pb
from cluster.topology import Instance, NodeState, Topology
from pinmq.node import Node
from pinmq_pb import cluster_pb2 as cpb
from pinmq_pb import cluster_pb2_grpc as cpb_grpc

WAIT_S = 15.0

# ---- pure -----------------------------------------------------------------------------------


def state(
    node: str,
    instances: dict[str, dict[str, int]] | None = None,
    *,
    version: int = 1,
    incarnation: int = 1,
    handler: Any = None,
) -> NodeState:
    return NodeState(node, f"{node}.example:7701", handler, instances or {}, version, incarnation)


def linked(local: str, *states: NodeState) -> Topology:
    topo = Topology(local)
    for s in states:
        topo.update(s)
        topo.connected(s.node_id)
    return topo


def test_instances_local_first_then_by_node_and_queue() -> None:
    topo = linked(
        "n2",
        state("n3", {"a": {"q": 1}}),
        state("n1", {"a": {"q2": 0, "q1": 4}, "b": {"x": 1}}),
        state("n2", {"a": {"q": 2}}),
    )
    assert topo.instances("a") == [
        Instance("q", "n2", 2, True, "a"),
        Instance("q1", "n1", 4, False, "a"),
        Instance("q2", "n1", 0, False, "a"),
        Instance("q", "n3", 1, False, "a"),
    ]
    assert topo.instances("nowhere") == []


def test_a_peer_state_counts_only_once_it_is_connected() -> None:
    topo = Topology("n1")
    topo.update(state("n1", {"a": {"q": 0}}))
    assert topo.update(state("n2", {"a": {"q": 1}}))
    assert [str(i) for i in topo.instances("a")] == ["q@n1"]
    assert topo.connected("n2")
    assert not topo.connected("n2")  # no news
    assert [str(i) for i in topo.instances("a")] == ["q@n1", "q@n2"]


def test_disconnected_peers_leave_routing_but_stay_known() -> None:
    topo = linked("n1", state("n1"), state("n2", {"a": {"q": 3}}))
    assert topo.disconnected("n2", now_ns=42)
    assert not topo.disconnected("n2", now_ns=43)
    assert topo.instances("a") == []
    assert topo.instances("a", include_down=True) == [Instance("q", "n2", 3, False, "a")]
    view = {v.state.node_id: v for v in topo.nodes()}
    assert not view["n2"].connected and view["n2"].down_since_ns == 42
    assert view["n1"].connected and view["n1"].local
    assert not topo.has_instance("q", "n2")
    assert topo.connected("n2")
    assert topo.has_instance("q", "n2") and not topo.has_instance("other", "n2")
    assert topo.nodes()[1].down_since_ns is None


def test_the_local_node_never_disconnects() -> None:
    topo = linked("n1", state("n1", {"a": {"q": 0}}))
    assert not topo.disconnected("n1", now_ns=1)
    assert topo.is_connected("n1")


def test_stale_states_are_ignored_and_a_restart_wins() -> None:
    topo = linked("n1", state("n2", {"a": {"q": 0}}, version=5, incarnation=10))
    assert not topo.update(state("n2", {"a": {"q": 9}}, version=4, incarnation=10))
    assert topo.instances("a")[0].consumers == 0
    assert topo.update(state("n2", {"a": {"q": 1}}, version=6, incarnation=10))
    assert topo.instances("a")[0].consumers == 1
    # Restarted: its version counter starts again, under a higher incarnation.
    assert topo.update(state("n2", {"b": {"r": 0}}, version=1, incarnation=11))
    assert topo.instances("a") == [] and [str(i) for i in topo.instances("b")] == ["r@n2"]


def test_update_reports_only_changes_a_reader_would_notice() -> None:
    topo = linked("n1", state("n2", {"a": {"q": 0}}, version=1))
    assert not topo.update(state("n2", {"a": {"q": 0}}, version=2))
    assert topo.state("n2").version == 2  # type: ignore[union-attr]
    assert topo.update(state("n2", {"a": {"q": 0}, "b": {"r": 0}}, version=3))


def test_local_handler_and_problems() -> None:
    topo = linked("n2", state("n2", handler="REMOTE"), state("n3", handler="REMOTE"))
    assert topo.local_handler() is None
    assert topo.problems() == ["no LOCAL grouping handler"]
    topo.update(state("n1", handler="LOCAL"))
    assert topo.local_handler() == ("n1", "n1.example:7701")
    assert topo.problems() == []
    topo.disconnected("n1", now_ns=1)  # still where the REMOTE handlers must ask
    assert topo.local_handler() == ("n1", "n1.example:7701")
    topo.update(state("n3", handler="LOCAL", version=2))
    assert topo.local_handler() is None
    assert topo.problems() == ["two LOCAL grouping handlers: n1, n3"]


def test_no_grouping_handlers_at_all_is_not_a_problem() -> None:
    topo = linked("n1", state("n1"), state("n2"))
    assert topo.problems() == [] and topo.local_handler() is None


def test_forget_drops_a_peer_but_never_the_local_node() -> None:
    topo = linked("n1", state("n1"), state("n2", {"a": {"q": 0}}))
    assert topo.forget("n2") and not topo.forget("n2")
    assert not topo.forget("n1")
    assert topo.peers() == [] and topo.instances("a") == []


def test_state_survives_the_wire_format() -> None:
    s = state("n7", {"a": {"q": 3, "r": 0}, "b": {"x": 1}}, version=9, incarnation=77)
    for handler in (None, "LOCAL", "REMOTE"):
        s2 = NodeState(s.node_id, s.cluster_address, handler, s.instances, 9, 77)
        assert state_from_pb(state_to_pb(s2, "c")) == s2


# ---- gossip between node processes ------------------------------------------------------------


class Cluster:
    """Node processes that name each other as connectors (all ports picked up front)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.nodes: dict[str, NodeProcess] = {}
        self.cluster_addr: dict[str, str] = {}

    def start(self, spec: dict[str, dict[str, Any]]) -> None:
        """`spec`: node id -> extra config; every node lists every other one as a connector."""
        for node_id in spec:
            self.cluster_addr[node_id] = f"127.0.0.1:{reserve_port()}"
        for node_id, extra in spec.items():
            workdir = self.tmp_path / node_id
            workdir.mkdir()
            peers = [a for n, a in self.cluster_addr.items() if n != node_id]
            config = {
                "node": {"id": node_id},
                "listen": {"cluster": self.cluster_addr[node_id]},
                "cluster": {"connectors": peers, "reconnect-interval": 100},
                **extra,
            }
            self.nodes[node_id] = NodeProcess(workdir, config).start(wait=False)
        for node in self.nodes.values():
            node.wait_serving()

    def inspect(self, node_id: str) -> cpb.InspectResponse:
        with grpc.insecure_channel(self.cluster_addr[node_id]) as channel:
            return cpb_grpc.ClusterStub(channel).Inspect(cpb.InspectRequest(), timeout=5)

    def view(self, node_id: str) -> dict[str, dict[str, Any]]:
        """node id -> {connected, handler, instances: {queue: consumers}} as `node_id` sees it."""
        return {
            n.state.node_id: {
                "connected": n.connected,
                "handler": n.state.handler,
                "instances": {i.queue: i.consumers for i in n.state.instances},
            }
            for n in self.inspect(node_id).nodes
        }

    async def wait(self, node_id: str, check: Callable[[dict[str, dict[str, Any]]], bool]) -> None:
        deadline = time.monotonic() + WAIT_S
        seen: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            try:
                seen = self.view(node_id)
            except grpc.RpcError as err:
                if err.code() not in NOT_YET:
                    raise
            else:
                if check(seen):
                    return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{node_id} never saw the expected topology; last view: {seen}")

    def kill(self) -> None:
        for node in self.nodes.values():
            node.kill()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.kill()


def _queue(view: dict[str, dict[str, Any]], node: str, queue: str) -> int | None:
    entry = view.get(node)
    return entry["instances"].get(queue) if entry and entry["connected"] else None


@pytest.mark.slow
async def test_gossip_queues_consumers_and_a_peer_restart(cluster: Cluster) -> None:
    cluster.start(
        {
            "n1": {"grouping-handler": {"type": "LOCAL"}},
            "n2": {"grouping-handler": {"type": "REMOTE"}},
            "n3": {"grouping-handler": {"type": "REMOTE"}},
        }
    )
    n2, n3 = cluster.nodes["n2"], cluster.nodes["n3"]
    for node_id in ("n1", "n2", "n3"):
        await cluster.wait(
            node_id, lambda v: len(v) == 3 and all(n["connected"] for n in v.values())
        )
    view = cluster.view("n2")
    assert {n: v["handler"] for n, v in view.items()} == {
        "n1": cpb.HANDLER_LOCAL,
        "n2": cpb.HANDLER_REMOTE,
        "n3": cpb.HANDLER_REMOTE,
    }
    assert list(cluster.inspect("n3").problems) == []

    # A queue created on n2 and a consumer on n3's instance reach the other nodes.
    async with Client(n2.url) as c2, Client(n3.url) as c3:
        await c2.create_queue("orders")
        await c3.create_queue("orders")
        for node_id in ("n1", "n3"):
            await cluster.wait(node_id, lambda v: _queue(v, "n2", "orders") == 0)
        async with c3.consumer("orders") as consumer:
            await consumer.start()
            await cluster.wait("n1", lambda v: _queue(v, "n3", "orders") == 1)
            await cluster.wait("n2", lambda v: _queue(v, "n3", "orders") == 1)
        await cluster.wait("n1", lambda v: _queue(v, "n3", "orders") == 0)
        await c2.delete_queue("orders")
        await cluster.wait("n1", lambda v: _queue(v, "n2", "orders") is None and "n2" in v)

    # n3 dies: the others see it go; it restarts with its durable queue and is back.
    n3.stop(signal.SIGKILL)
    await cluster.wait("n1", lambda v: not v["n3"]["connected"])
    await cluster.wait("n2", lambda v: not v["n3"]["connected"])
    down = next(n for n in cluster.inspect("n1").nodes if n.state.node_id == "n3")
    assert down.down_since_unix_ms > 0
    n3.start()
    for node_id in ("n1", "n2"):
        await cluster.wait(node_id, lambda v: _queue(v, "n3", "orders") == 0)
    async with Client(n3.url) as c3, c3.consumer("orders") as consumer:
        await consumer.start()
        await cluster.wait("n1", lambda v: _queue(v, "n3", "orders") == 1)


async def test_two_local_handlers_and_another_cluster_are_reported(cluster: Cluster) -> None:
    cluster.start(
        {
            "n1": {"grouping-handler": {"type": "LOCAL"}},
            "n2": {"grouping-handler": {"type": "LOCAL"}},
            "x9": {"cluster": {"name": "other", "connectors": [], "reconnect-interval": 100}},
        }
    )
    await cluster.wait("n1", lambda v: v.get("n2", {}).get("connected", False))
    assert list(cluster.inspect("n1").problems) == ["two LOCAL grouping handlers: n1, n2"]
    # x9 belongs to another cluster: both sides refuse the link, nobody learns about it.
    for node_id in ("n1", "x9"):  # each has refused it (a wait proves nothing would come)
        async with asyncio.timeout(WAIT_S):
            while "cluster name mismatch" not in cluster.nodes[node_id].log():
                await asyncio.sleep(0.05)
    assert set(cluster.view("n1")) == {"n1", "n2"}
    assert set(cluster.view("x9")) == {"x9"}


async def test_a_connector_leading_back_to_the_node_itself_is_dropped(tmp_path: Path) -> None:
    port = reserve_port()
    config = NodeConfig.model_validate(
        {
            "node": {"id": "solo", "data-dir": str(tmp_path / "solo")},
            "listen": {
                "client": f"127.0.0.1:{reserve_port()}",
                "stomp": f"127.0.0.1:{reserve_port()}",
                "http": f"127.0.0.1:{reserve_port()}",
                "cluster": f"127.0.0.1:{port}",
            },
            # The same node under another name, and literally its own listen address.
            "cluster": {
                "connectors": [f"localhost:{port}", f"127.0.0.1:{port}"],
                "reconnect-interval": 100,
            },
        }
    )
    node = Node(config)
    await node.start()
    try:
        name = f"connector:localhost:{port}"
        task = next(t for t in asyncio.all_tasks() if t.get_name() == name)
        await asyncio.wait_for(task, WAIT_S)  # it gives up instead of re-dialling forever
        assert not any(t.get_name() == f"connector:127.0.0.1:{port}" for t in asyncio.all_tasks())
        assert node.cluster is not None
        assert [v.state.node_id for v in node.cluster.topology.nodes()] == ["solo"]
    finally:
        await node.stop(0)
