"""Clustered grouping end to end: real node processes on loopback, one data dir and ports each.

A three-node cluster (n1 LOCAL, n2 and n3 REMOTE) is shared by the scenarios here, which stop
no node (each uses its own queue names); scenarios that stop, kill or restart nodes, or need
other grouping settings, are in test_cluster_faults.py with a cluster of their own. Assertions
are about where messages went (one consumer per group, in order, exactly the messages sent),
never about timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from cluster_nodes import (
    NODES,
    ClusterNodes,
    Consuming,
    consumers_on,
    create_everywhere,
    grouping,
    in_order,
    stomp_send,
)
from conftest import cli, unique
from waiting import until

NEWS = {"news": {"routing-type": "multicast", "queues": {"news.a": {}, "news.b": {}}}}


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterNodes]:
    """n1 LOCAL, n2/n3 REMOTE, ON_DEMAND; a multicast address `news` with two queues."""
    spec = grouping(NODES, extra={"addresses": NEWS})
    nodes = ClusterNodes(tmp_path_factory.mktemp("trio"), spec).start()
    yield nodes
    nodes.kill_all()


# ---- pure: the cluster-wide group listing ------------------------------------------------------


def test_merge_lists_bindings_with_their_table_entries_and_unbound_groups() -> None:
    from broker.info import ClusterGroupInfo
    from cluster.admin import merge
    from handler.api import Binding, BindingUse

    ms = 1_000_000
    bindings = [BindingUse(Binding("g1", "q", "n2", 1), 500)]
    rows = [
        ClusterGroupInfo("g1", "q", "n2", False, "c-1", "worker", 3, 1, 700 * ms),
        ClusterGroupInfo("g1", "q", "n3", False, None, None, 2, 0, 100 * ms),  # left behind
    ]
    merged = merge(bindings, rows)
    assert [(e.group, e.queue, e.node, e.bound) for e in merged] == [
        ("g1", "q", "n2", True),
        ("g1", "q", "n3", False),
    ]
    assert (merged[0].owner_name, merged[0].pending, merged[0].last_use_ns) == (
        "worker",
        3,
        700 * ms,
    )
    assert merge(bindings, [])[0].owner is None


# ---- the shared three-node cluster ---------------------------------------------------------------


async def test_one_group_sent_through_every_node_reaches_one_consumer_in_order(
    trio: ClusterNodes,
    consuming: Consuming,
) -> None:
    queue, group = unique("orders"), unique("g")
    await create_everywhere(trio, queue)
    collector = consuming.collector()
    clients = consuming.clients
    await consumers_on(trio, queue, NODES, collector, clients)
    sent: list[str] = []
    for node_id in NODES:  # each chunk arrives before the next leaves: one total order
        async with trio.client(node_id) as client:
            producer = client.producer(queue, group_id=group)
            chunk = [f"{node_id}-{i}" for i in range(10)]
            await producer.send_batch(chunk[:5])
            for body in chunk[5:]:
                await producer.send(body)
        sent += chunk
        await collector.wait(len(sent), f"after the chunk through {node_id}")
    # ... and over STOMP, through a REMOTE node.
    frames = await stomp_send(
        trio.stomp_port("n3"), queue, [(f"stomp-{i}", {"JMSXGroupID": group}) for i in range(5)]
    )
    assert frames[-1].command == "RECEIPT", frames
    sent += [f"stomp-{i}" for i in range(5)]
    await collector.wait(len(sent))
    owner = in_order(collector, {group: sent})[group]

    # One call to any node lists the group with its binding and its consumer.
    async with trio.client("n3") as client:
        listing = await client.cluster_groups(queue)
    assert listing.unreachable == [] and listing.problems == []
    [entry] = [g for g in listing.groups if g.group == group]
    assert (entry.queue, entry.node, entry.bound, entry.owner_name) == (
        queue,
        owner,
        True,
        owner,
    )
    shown = cli("groups", "--cluster", queue, "--url", trio.url("n2"))
    assert shown.returncode == 0, shown.stderr
    assert group in shown.stdout and f"{queue}@{owner}" in shown.stdout

    # Unpinned everywhere by one command: the binding goes, the owner's queue lets go.
    reset = cli("reset-groups", "--cluster", "--group", group, queue, "--url", trio.url("n2"))
    assert reset.returncode == 0, reset.stderr
    assert "1 binding(s) removed" in reset.stdout

    async def unpinned() -> bool:
        async with trio.client(owner) as client:
            table = await client.groups(queue)
            listing = await client.cluster_groups(queue)
        return group not in {g.group for g in table} and listing.groups == []

    await until("the group to be unpinned everywhere", unpinned)


async def test_new_groups_spread_round_robin_over_the_nodes_consumers(
    trio: ClusterNodes, consuming: Consuming
) -> None:
    queue = unique("spread")
    await create_everywhere(trio, queue)
    collector = consuming.collector()
    clients = consuming.clients
    await consumers_on(trio, queue, NODES, collector, clients)
    expected = {f"{queue}-g{i}": [f"g{i}-{k}" for k in range(3)] for i in range(9)}
    async with trio.client("n2") as client:
        for group, bodies in expected.items():
            producer = client.producer(queue, group_id=group)
            for body in bodies:
                await producer.send(body)
    await collector.wait(27)
    owner = in_order(collector, expected)
    per_node = {n: sorted(g for g, o in owner.items() if o == n) for n in NODES}
    assert all(len(groups) == 3 for groups in per_node.values()), per_node


async def test_nine_concurrent_senders_through_a_remote_node_keep_each_group_on_one_consumer(
    trio: ClusterNodes,
    consuming: Consuming,
) -> None:
    queue = unique("nine")
    await create_everywhere(trio, queue)
    collector = consuming.collector()
    clients = consuming.clients
    await consumers_on(trio, queue, NODES, collector, clients)
    expected = {f"{queue}-g{i}": [f"g{i}-{k}" for k in range(200)] for i in range(9)}
    async with trio.client("n3") as client:

        async def produce(group: str) -> None:
            producer = client.producer(queue, group_id=group)
            await producer.send_many(expected[group], batch_size=20, window=4)

        await asyncio.gather(*(produce(g) for g in expected))
    await collector.wait(9 * 200)
    owner = in_order(collector, expected)
    assert len(set(owner.values())) > 1  # the groups were spread, and none split


async def test_only_a_remote_node_has_a_consumer_and_sends_through_every_node_reach_it(
    trio: ClusterNodes,
    consuming: Consuming,
) -> None:
    queue = unique("remote-only")
    await create_everywhere(trio, queue)
    collector = consuming.collector()
    clients = consuming.clients
    await consumers_on(trio, queue, ["n3"], collector, clients)
    expected: dict[str, list[str]] = {}
    ungrouped: list[str] = []
    for node_id in NODES:
        group = f"{queue}-via-{node_id}"
        expected[group] = [f"{node_id}-{k}" for k in range(10)]
        async with trio.client(node_id) as client:
            await client.producer(queue, group_id=group).send_batch(expected[group])
            plain = [f"plain-{node_id}-{k}" for k in range(5)]
            await client.producer(queue).send_batch(plain)
            ungrouped += plain
    await collector.wait(3 * 15)
    per_group = collector.per_group()
    assert sorted(b for _, b in per_group.pop(None)) == sorted(ungrouped)
    collector.got = [(label, m) for label, m in collector.got if m.group_id]
    assert set(in_order(collector, expected).values()) == {"n3"}


async def test_two_queues_on_one_address_each_bind_the_group_on_their_own(
    trio: ClusterNodes, consuming: Consuming
) -> None:
    """Multicast `news`: news.a and news.b each get every message; (group, queue) is the key."""
    group = unique("g")
    a, b = consuming.collector(), consuming.collector()
    clients = consuming.clients
    for collector, queue, node_id in ((a, "news.a", "n2"), (b, "news.b", "n3")):
        client = trio.client(node_id)
        await client.connect()
        clients.append(client)
        await collector.add(client, queue, node_id)
    trio.wait_consumers("news.a", {"n1": 0, "n2": 1, "n3": 0})
    trio.wait_consumers("news.b", {"n1": 0, "n2": 0, "n3": 1})
    bodies = [f"m{i}" for i in range(20)]
    async with trio.client("n1") as client:
        producer = client.producer("news", group_id=group)
        await producer.send_batch(bodies[:10])
        await producer.send_many(bodies[10:], batch_size=3)
        listing = await client.cluster_groups(group=group)
    await a.wait(20)
    await b.wait(20)
    assert in_order(a, {group: bodies}) == {group: "n2"}
    assert in_order(b, {group: bodies}) == {group: "n3"}
    bound = {(g.queue, g.node) for g in listing.groups if g.bound}
    assert bound == {("news.a", "n2"), ("news.b", "n3")}


async def test_a_deleted_bound_queue_unbinds_its_groups_and_they_bind_again_elsewhere(
    trio: ClusterNodes,
    consuming: Consuming,
) -> None:
    queue, group = unique("moving"), unique("g")
    first, second = consuming.collector(), consuming.collector()
    clients = consuming.clients
    await create_everywhere(trio, queue, ["n2"])
    await consumers_on(trio, queue, ["n2"], first, clients)
    async with trio.client("n1") as client:
        await client.producer(queue, group_id=group).send_batch(["a0", "a1", "a2"])
    await first.wait(3)
    assert in_order(first, {group: ["a0", "a1", "a2"]}) == {group: "n2"}
    await first.close()
    async with trio.client("n2") as client:
        await client.delete_queue(queue)

    async def unbound() -> bool:
        async with trio.client("n1") as client:
            return (await client.cluster_groups(queue)).groups == []

    await until("the binding of the deleted queue to go", unbound)
    await create_everywhere(trio, queue, ["n3"])
    await consumers_on(trio, queue, ["n3"], second, clients)
    async with trio.client("n1") as client:
        await client.producer(queue, group_id=group).send_batch(["b0", "b1"])
        await second.wait(2)
        listing = await client.cluster_groups(queue)
    assert in_order(second, {group: ["b0", "b1"]}) == {group: "n3"}
    assert [(g.group, g.node, g.bound) for g in listing.groups] == [(group, "n3", True)]


async def test_ungrouped_messages_move_when_a_queue_loses_its_consumers_grouped_never(
    trio: ClusterNodes,
    consuming: Consuming,
) -> None:
    queue, group = unique("redis"), unique("g")
    await create_everywhere(trio, queue, ["n1", "n2"])
    other = consuming.collector()
    clients = consuming.clients
    # n1's consumer takes one message and never acks it (prefetch 1): the rest waits at n1.
    client1 = trio.client("n1")
    await client1.connect()
    clients.append(client1)
    holder = client1.consumer(queue, name="holder", prefetch=1)
    await holder.start()
    trio.wait_consumers(queue, {"n1": 1, "n2": 0})
    grouped = [f"g{i}" for i in range(4)]
    await client1.producer(queue, group_id=group).send_batch(grouped)  # bound to n1
    await consumers_on(trio, queue, ["n2"], other, clients)
    plain = [f"u{i}" for i in range(10)]
    await client1.producer(queue).send_batch(plain)  # round robin over n1 and n2
    held = await holder.receive(5)
    assert held is not None and held.body == b"g0"
    await holder.close()  # n1 loses its consumer: its ungrouped messages go to n2
    await other.wait(len(plain))
    assert sorted(other.bodies()) == sorted(plain)
    async with trio.client("n1") as client:
        [info] = [q for q in await client.queues() if q.name == queue]
    assert info.depth == len(grouped)  # the group stayed where it is bound


# ---- clusters of their own: nodes stop, die and restart ----------------------------------------
