"""The clustered send path's decisions (cluster/sending.py), in process and without I/O.

An engine without a store (tests/engine_harness.py: real units over a real core, whose
commits are recorded) gets a real `ClusterMember` (its topology fed by hand, so
routing is real) and a scripted grouping handler, wired as the node process wires them, so
every decision can be checked on the Effects the `ClusteredSendPath` returns: which queue,
which node, what is left untouched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_harness import RecordingEngine, send, send_now
from send_harness import ME, Node, ScriptedHandler, bind, msg, peers

from broker.config import NodeConfig, QueueConfig
from broker.core import CoreError
from broker.effects import Effects
from broker.message import GROUP_ID_HEADER, Outgoing
from cluster.bridge import FORWARD_HEADER, sf_queue
from cluster.member import ClusterMember
from cluster.sending import ClusteredSendPath, GroupingUnavailable
from cluster.topology import NodeState
from handler.api import DecisionTimeout, HandlerUnavailable


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    """make(type=..., **config) -> (node, handler); peers n2 and n3 are linked."""

    def build(handler_type: str = "REMOTE", **extra: Any) -> tuple[Node, ScriptedHandler]:
        config = NodeConfig.model_validate(
            {
                "node": {"id": ME, "data-dir": str(tmp_path / ME)},
                "cluster": {"address": "orders", "load-balancing": "ON_DEMAND"},
                "grouping-handler": {"type": handler_type, "address": "orders"},
                **extra,
            }
        )
        engine = RecordingEngine(config)
        cluster = ClusterMember(engine)
        handler = ScriptedHandler()
        return Node(engine, cluster, ClusteredSendPath(engine, cluster, handler)), handler

    yield build


def where(node: Node, fx: Effects) -> list[tuple[str, str]]:
    """(body, queue@node) of every message added: forwarded ones by their SF queue's target."""
    out = []
    for m in fx.added:
        if m.queue.startswith("$sf."):
            target = m.queue.rsplit(".", 1)[1]
            out.append((m.body.decode(), f"{m.headers[FORWARD_HEADER]}@{target}"))
        else:
            out.append((m.body.decode(), f"{m.queue}@{ME}"))
    return out


def untouched(node: Node) -> bool:
    return all(q.depth == 0 for q in node.core.queues()) and not any(
        q.name.startswith("$sf.") for q in node.core.queues()
    )


async def test_ungrouped_round_robin_and_cached_groups_route_at_once(make: Any) -> None:
    node, handler = make()
    node.core.create_queue("orders", "orders", QueueConfig())
    peers(node, {"n2": {"orders": {"orders": 1}}, "n3": {"orders": {"orders": 1}}})
    bind(handler, "g-here", "orders", ME)
    bind(handler, "g-n3", "orders", "n3")
    batch = [msg("u1"), msg("u2"), msg("a", "g-n3"), msg("b", "g-here"), msg("c", "g-n3")]
    sent = send_now(node.engine, node.sender, batch, 1)
    assert sent is not None
    ids, fx = sent
    assert len(ids) == 5 and ids == sorted(ids)
    assert where(node, fx) == [
        ("u1", "orders@n2"),  # ON_DEMAND: only instances with consumers, local first if busy
        ("u2", "orders@n3"),
        ("a", "orders@n3"),
        ("b", f"orders@{ME}"),
        ("c", "orders@n3"),
    ]
    assert handler.calls == []


async def test_a_missing_decision_defers_the_whole_batch_and_changes_nothing(make: Any) -> None:
    node, handler = make()
    node.core.create_queue("orders", "orders", QueueConfig())
    peers(node, {"n2": {"orders": {"orders": 1}}})
    bind(handler, "known", "orders", "n2")
    batch = [msg("a", "known"), msg("b", "new"), msg("u")]
    assert send_now(node.engine, node.sender, batch, 1) is None
    assert untouched(node) and handler.calls == []


async def test_send_awaits_every_missing_decision_concurrently_then_routes_in_order(
    make: Any,
) -> None:
    node, handler = make()
    node.core.create_queue("orders", "orders", QueueConfig())
    peers(node, {"n2": {"orders": {"orders": 1}}, "n3": {"orders": {"orders": 0}}})
    handler.release.clear()
    batch = [msg("a1", "ga"), msg("b1", "gb"), msg("a2", "ga"), msg("u")]
    sending = asyncio.create_task(send(node.engine, node.sender, batch))
    for _ in range(10):
        await asyncio.sleep(0)
    # Both decisions are asked for at once, each once, proposing what routing picks (the
    # only instance with consumers); nothing is routed while they are out.
    assert sorted(handler.calls) == [("ga", "orders", "n2"), ("gb", "orders", "n2")]
    assert untouched(node) and not sending.done()
    handler.release.set()
    ids, fx = await sending
    assert len(ids) == 4
    assert [body for body, _ in where(node, fx)] == ["a1", "b1", "a2", "u"]
    assert {target for _, target in where(node, fx)} == {"orders@n2"}


async def test_no_decision_in_time_fails_the_batch_and_enqueues_nothing(make: Any) -> None:
    node, handler = make()
    node.core.create_queue("orders", "orders", QueueConfig())
    bind(handler, "known", "orders", ME)
    text = "no grouping decision for group 'new' on queue 'orders' within 1000 ms: unreachable"
    handler.fail = DecisionTimeout(text)
    with pytest.raises(GroupingUnavailable, match="within 1000 ms") as failed:
        await send(node.engine, node.sender, [msg("a", "known"), msg("b", "new")])
    assert failed.value.code == "unavailable" and str(failed.value) == text
    assert untouched(node)
    handler.fail = HandlerUnavailable("the LOCAL grouping handler is not running")
    with pytest.raises(GroupingUnavailable, match="not running"):
        await send(node.engine, node.sender, [msg("b", "new")])


async def test_a_multicast_address_binds_each_queue_on_its_own(make: Any) -> None:
    news = {"orders": {"routing-type": "multicast", "queues": {"orders.a": {}, "orders.b": {}}}}
    node, handler = make(addresses=news)
    peers(node, {"n2": {"orders": {"orders.a": 1, "orders.b": 0}}})
    bind(handler, "g", "orders.a", "n2")
    bind(handler, "g", "orders.b", ME)
    sent = send_now(node.engine, node.sender, [msg("x", "g")], 1)
    assert sent is not None
    assert sorted(where(node, sent[1])) == [("x", "orders.a@n2"), ("x", f"orders.b@{ME}")]


async def test_a_queue_only_other_nodes_have_is_the_target_and_keys_the_group(make: Any) -> None:
    node, handler = make()
    peers(node, {"n3": {"orders": {"orders.q": 1}}})
    assert await send(node.engine, node.sender, [msg("x", "g")]) is not None
    assert handler.calls == [("g", "orders.q", "n3")]


async def test_addresses_outside_the_cluster_take_the_standalone_path(make: Any) -> None:
    node, handler = make(**{"address-settings": {"closed": {"auto-create-queues": False}}})
    peers(node, {"n2": {"misc": {"misc": 5}}})  # not clustered: cluster.address is "orders"
    sent = send_now(node.engine, node.sender, [msg("x", "g", address="misc")], 1)
    assert sent is not None and where(node, sent[1]) == [("x", f"misc@{ME}")]
    with pytest.raises(CoreError, match="closed"):  # refused before anything is enqueued
        send_now(
            node.engine, node.sender, [msg("y", address="orders"), msg("z", address="closed")], 2
        )
    assert node.core.queues_of("orders") == [] and handler.calls == []


async def test_a_local_handler_that_sees_another_refuses_new_groups(make: Any) -> None:
    node, handler = make("LOCAL")
    peers(node, {"n2": {}}, n2="LOCAL")
    node.cluster.topology.update(NodeState(ME, f"{ME}:7701", "LOCAL", {}, 2, 1))
    with pytest.raises(GroupingUnavailable, match="two LOCAL grouping handlers"):
        await send(node.engine, node.sender, [msg("x", "g")])
    assert handler.calls == []
    bind(handler, "g", "orders", ME)  # a group bound before goes on
    assert send_now(node.engine, node.sender, [msg("x", "g")], 1) is not None


async def test_redistribution_moves_ungrouped_messages_only(make: Any) -> None:
    node, _ = make()
    node.core.create_queue("orders", "orders", QueueConfig())
    for i, group in enumerate([None, "g", None, "g", None]):
        node.core.send(
            Outgoing("orders", f"m{i}".encode(), {GROUP_ID_HEADER: group} if group else {}, True), 1
        )
    node.engine.applied.clear()
    applied = node.engine.applied
    node.sender.redistribute_all()
    assert applied == []  # no instance elsewhere has consumers
    peers(node, {"n2": {"orders": {"orders": 0}}, "n3": {"orders": {"orders": 2}}})
    node.sender.redistribute_all()
    [fx] = applied
    assert [m.body for m in fx.removed] == [b"m0", b"m2", b"m4"]
    assert where(node, Effects(added=fx.added)) == [
        ("m0", "orders@n3"),
        ("m2", "orders@n3"),
        ("m4", "orders@n3"),
    ]
    assert node.core.queue("orders").depth == 2  # the group stays
    assert node.core.queue(sf_queue("pinmq", "n3")).depth == 3


async def test_duplicates_are_dropped_on_the_entry_node_before_any_decision(make: Any) -> None:
    node, handler = make()
    node.core.create_queue("orders", "orders", QueueConfig())
    peers(node, {"n2": {"orders": {"orders": 1}}})
    bind(handler, "known", "orders", "n2")
    sent = send_now(node.engine, node.sender, [msg("a", "known", dup="x"), msg("u", dup="y")], 1)
    assert sent is not None
    first, fx = sent
    assert where(node, fx) == [("a", "orders@n2"), ("u", "orders@n2")]
    # The forwarded copy's msg id (its SF queue's) is what the sender got; the id is stored
    # with it, on this node: the receiving node never screens forwarded messages.
    assert fx.duplicate_ids == [("orders", "x", first[0]), ("orders", "y", first[1])]
    # Sent again, in a new group that would need a decision: dropped, no decision asked for.
    batch = [msg("a", "new", dup="x"), msg("b", "known"), msg("u", dup="y"), msg("b2", dup="z")]
    sent = send_now(node.engine, node.sender, [*batch, msg("b2 again", dup="z")], 2)
    assert sent is not None
    ids, fx = sent
    assert handler.calls == []
    assert ids[0] == first[0] and ids[2] == first[1] and ids[4] == ids[3]
    assert [body for body, _ in where(node, fx)] == ["b", "b2"]
    assert [(address, dup) for address, dup, _ in fx.duplicates] == [
        ("orders", "x"),
        ("orders", "y"),
        ("orders", "z"),
    ]


async def test_a_batch_awaiting_a_decision_drops_an_id_accepted_meanwhile(make: Any) -> None:
    node, handler = make()
    node.core.create_queue("orders", "orders", QueueConfig())
    peers(node, {"n2": {"orders": {"orders": 1}}})
    bind(handler, "known", "orders", ME)
    handler.release.clear()
    waiting = asyncio.create_task(
        send(node.engine, node.sender, [msg("late", "new", dup="x"), msg("w")])
    )
    for _ in range(10):
        await asyncio.sleep(0)
    assert handler.calls == [("new", "orders", "n2")] and not waiting.done()
    # Another connection brings the same id and is routed at once.
    sent = send_now(node.engine, node.sender, [msg("early", "known", dup="x")], 1)
    assert sent is not None
    (early,), _ = sent
    handler.release.set()
    ids, fx = await waiting
    assert ids[0] == early  # screened again once decided: the id came meanwhile
    assert [body for body, _ in where(node, fx)] == ["w"]
    assert node.core.duplicates_dropped == 1
