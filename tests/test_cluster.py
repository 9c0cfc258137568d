"""Clustered grouping end to end: real node processes on loopback, one data dir and ports each.

A three-node cluster (n1 LOCAL, n2 and n3 REMOTE) is shared by the scenarios that stop no node
(each uses its own queue names); scenarios that stop, kill or restart nodes, or need other
grouping settings, start a cluster of their own. Assertions are about where messages went
(one consumer per group, in order, exactly the messages sent), never about timing.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_nodes import ClusterNodes, Collector, grouping, stomp_send
from conftest import cli, unique
from grpc_health.v1 import health_pb2

from broker.client import Client, Unavailable

NODES = ("n1", "n2", "n3")
NEWS = {"news": {"routing-type": "multicast", "queues": {"news.a": {}, "news.b": {}}}}


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterNodes]:
    """n1 LOCAL, n2/n3 REMOTE, ON_DEMAND; a multicast address `news` with two queues."""
    spec = grouping(NODES, extra={"addresses": NEWS})
    nodes = ClusterNodes(tmp_path_factory.mktemp("trio"), spec).start()
    yield nodes
    nodes.kill_all()


@pytest.fixture
def own(tmp_path: Path) -> Iterator[list[ClusterNodes]]:
    """Clusters a destructive scenario starts for itself (`own.append(ClusterNodes(...))`)."""
    started: list[ClusterNodes] = []
    yield started
    for nodes in started:
        nodes.kill_all()


async def create_everywhere(nodes: ClusterNodes, queue: str, node_ids=NODES) -> None:
    for node_id in node_ids:
        async with nodes.client(node_id) as client:
            await client.create_queue(queue)


async def consumers_on(
    nodes: ClusterNodes, queue: str, node_ids, collector: Collector, clients: list[Client]
) -> None:
    """One consumer per node (labelled with the node id), seen by every node before returning."""
    for node_id in node_ids:
        client = nodes.client(node_id)
        await client.connect()
        clients.append(client)
        await collector.add(client, queue, node_id)
    nodes.wait_consumers(queue, {n: 1 for n in node_ids})


def in_order(collector: Collector, expected: dict[str, list[str]]) -> dict[str, str]:
    """Each group went whole to one consumer, in order, and nothing else arrived; group -> node."""
    per_group = collector.per_group()
    assert set(per_group) == set(expected), f"groups seen {set(per_group)}"
    owner: dict[str, str] = {}
    for group, bodies in expected.items():
        got = per_group[group]
        labels = {label for label, _ in got}
        assert len(labels) == 1, f"group {group} went to several consumers: {labels}"
        assert [b for _, b in got] == bodies, f"group {group} out of order or incomplete"
        owner[group] = labels.pop()
    return owner


# ---- pure: the cluster-wide group listing ------------------------------------------------------


def test_merge_lists_bindings_with_their_table_entries_and_unbound_groups() -> None:
    from cluster.admin import GroupRow, merge
    from handler.api import Binding, BindingUse

    bindings = [BindingUse(Binding("g1", "q", "n2", 1), 500)]
    rows = [
        GroupRow("n2", "q", "g1", "c-1", "worker", 3, 1, 700),
        GroupRow("n3", "q", "g1", None, None, 2, 0, 100),  # left there when g1 moved
    ]
    merged = merge(bindings, rows)
    assert [(e.group, e.queue, e.node, e.bound) for e in merged] == [
        ("g1", "q", "n2", True),
        ("g1", "q", "n3", False),
    ]
    assert (merged[0].owner_name, merged[0].pending, merged[0].last_use_unix_ms) == (
        "worker",
        3,
        700,
    )
    assert merge(bindings, [])[0].owner is None


# ---- the shared three-node cluster ---------------------------------------------------------------


async def test_one_group_sent_through_every_node_reaches_one_consumer_in_order(
    trio: ClusterNodes,
) -> None:
    queue, group = unique("orders"), unique("g")
    await create_everywhere(trio, queue)
    collector, clients = Collector(), []
    try:
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

        await until(unpinned, "the group to be unpinned everywhere")
    finally:
        await collector.close()
        for client in clients:
            await client.close()


async def until(check, what: str) -> None:
    """Poll an async check until it holds (bounded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while not await check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_new_groups_spread_round_robin_over_the_nodes_consumers(trio: ClusterNodes) -> None:
    queue = unique("spread")
    await create_everywhere(trio, queue)
    collector, clients = Collector(), []
    try:
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
    finally:
        await collector.close()
        for client in clients:
            await client.close()


async def test_nine_concurrent_senders_through_a_remote_node_keep_each_group_on_one_consumer(
    trio: ClusterNodes,
) -> None:
    queue = unique("nine")
    await create_everywhere(trio, queue)
    collector, clients = Collector(), []
    try:
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
    finally:
        await collector.close()
        for client in clients:
            await client.close()


async def test_only_a_remote_node_has_a_consumer_and_sends_through_every_node_reach_it(
    trio: ClusterNodes,
) -> None:
    queue = unique("remote-only")
    await create_everywhere(trio, queue)
    collector, clients = Collector(), []
    try:
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
    finally:
        await collector.close()
        for client in clients:
            await client.close()


async def test_two_queues_on_one_address_each_bind_the_group_on_their_own(
    trio: ClusterNodes,
) -> None:
    """Multicast `news`: news.a and news.b each get every message; (group, queue) is the key."""
    group = unique("g")
    a, b, clients = Collector(), Collector(), []
    try:
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
    finally:
        for collector in (a, b):
            await collector.close()
        for client in clients:
            await client.close()


async def test_a_deleted_bound_queue_unbinds_its_groups_and_they_bind_again_elsewhere(
    trio: ClusterNodes,
) -> None:
    queue, group = unique("moving"), unique("g")
    first, second, clients = Collector(), Collector(), []
    try:
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

        await until(unbound, "the binding of the deleted queue to go")
        await create_everywhere(trio, queue, ["n3"])
        await consumers_on(trio, queue, ["n3"], second, clients)
        async with trio.client("n1") as client:
            await client.producer(queue, group_id=group).send_batch(["b0", "b1"])
            await second.wait(2)
            listing = await client.cluster_groups(queue)
        assert in_order(second, {group: ["b0", "b1"]}) == {group: "n3"}
        assert [(g.group, g.node, g.bound) for g in listing.groups] == [(group, "n3", True)]
    finally:
        await first.close()
        await second.close()
        for client in clients:
            await client.close()


async def test_ungrouped_messages_move_when_a_queue_loses_its_consumers_grouped_never(
    trio: ClusterNodes,
) -> None:
    queue, group = unique("redis"), unique("g")
    await create_everywhere(trio, queue, ["n1", "n2"])
    other, clients = Collector(), []
    try:
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
    finally:
        await other.close()
        for client in clients:
            await client.close()


# ---- clusters of their own: nodes stop, die and restart ----------------------------------------


async def sf_depth(client: Client, peer: str) -> int:
    """Messages waiting in this node's store-and-forward queue for `peer`."""
    return sum(q.depth for q in await client.queues() if q.name == f"$sf.pinmq.{peer}")


async def test_messages_for_a_stopped_pinned_node_wait_and_arrive_in_order_after_its_restart(
    tmp_path: Path, own: list[ClusterNodes]
) -> None:
    # A timeout longer than the restart: the binding must outlive the node's absence.
    nodes = ClusterNodes(tmp_path, grouping(["n1", "n2"], timeout=30000))
    own.append(nodes.start())
    queue, group = unique("pinned"), unique("g")
    await create_everywhere(nodes, queue, ["n1", "n2"])
    before, after, clients = Collector(), Collector(), []
    try:
        await consumers_on(nodes, queue, ["n2"], before, clients)
        async with nodes.client("n1") as client:
            await client.producer(queue, group_id=group).send_batch(["m0", "m1"])
        await before.wait(2)
        assert in_order(before, {group: ["m0", "m1"]}) == {group: "n2"}
        await before.close()
        nodes.stop("n2")
        waiting = [f"m{i}" for i in range(2, 40)]
        async with nodes.client("n1") as client:
            await client.producer(queue, group_id=group).send_many(waiting, batch_size=7)
            assert await sf_depth(client, "n2") == len(waiting)  # held for n2, not re-routed
            nodes.start("n2")
            await consumers_on(nodes, queue, ["n2"], after, [])
            await after.wait(len(waiting))
            assert in_order(after, {group: waiting}) == {group: "n2"}

            async def drained() -> bool:
                return await sf_depth(client, "n2") == 0

            await until(drained, "n1's store-and-forward queue to drain")
    finally:
        await after.close()
        for client in clients:
            await client.close()


async def bind_then_stop_all(
    nodes: ClusterNodes, queue: str, groups: list[str], consumer_nodes, via: str
) -> tuple[dict[str, str], dict[str, str]]:
    """Bind `groups` with one message each sent through `via`, then stop every node.

    Returns the consumer's node of each group (checked whole and in order) and the bindings
    the cluster listed before the stop.
    """
    collector, clients = Collector(), []
    try:
        await consumers_on(nodes, queue, consumer_nodes, collector, clients)
        async with nodes.client(via) as client:
            for group in groups:
                await client.producer(queue, group_id=group).send("before")
            bound = {g.group: g.node for g in (await client.cluster_groups(queue)).groups}
        await collector.wait(len(groups))
        owner = in_order(collector, {g: ["before"] for g in groups})
    finally:
        await collector.close()
        for client in clients:
            await client.close()
    for node_id in NODES:
        nodes.stop(node_id)
    return owner, bound


async def test_the_whole_cluster_restarts_and_its_bindings_hold(
    tmp_path: Path, own: list[ClusterNodes]
) -> None:
    nodes = ClusterNodes(tmp_path, grouping(NODES, timeout=30000))
    own.append(nodes.start())
    queue = unique("restart")
    await create_everywhere(nodes, queue)
    groups = [f"{queue}-g{i}" for i in range(6)]
    owner, bound = await bind_then_stop_all(nodes, queue, groups, NODES, "n2")
    assert owner == bound and len(set(owner.values())) == 3
    nodes.start()
    second, clients = Collector(), []
    try:
        await consumers_on(nodes, queue, NODES, second, clients)
        async with nodes.client("n3") as client:  # a REMOTE node with an empty cache
            for group in groups:
                await client.producer(queue, group_id=group).send("after")
            listing = await client.cluster_groups(queue)
        await second.wait(len(groups))
        assert in_order(second, {g: ["after"] for g in groups}) == owner
        assert {g.group: g.node for g in listing.groups if g.bound} == bound
    finally:
        await second.close()
        for client in clients:
            await client.close()


async def test_groups_of_a_node_that_never_comes_back_are_bound_again_after_timeout(
    tmp_path: Path, own: list[ClusterNodes]
) -> None:
    nodes = ClusterNodes(tmp_path, grouping(NODES, timeout=3000))
    own.append(nodes.start())
    queue, group = unique("gone"), unique("g")
    await create_everywhere(nodes, queue)
    lost, found, clients = Collector(), Collector(), []
    try:
        await consumers_on(nodes, queue, ["n3"], lost, clients)
        async with nodes.client("n2") as client:
            await client.producer(queue, group_id=group).send_batch(["a0", "a1"])
        await lost.wait(2)
        assert in_order(lost, {group: ["a0", "a1"]}) == {group: "n3"}
        await lost.close()
        nodes.stop("n3", signal.SIGKILL)
        await consumers_on(nodes, queue, ["n1"], found, clients)

        async def rebindable() -> bool:
            async with nodes.client("n2") as client:
                listing = await client.cluster_groups(queue, group=group)
            return not any(g.bound for g in listing.groups)

        await until(rebindable, "the binding to the dead node to be dropped")
        async with nodes.client("n1") as client:
            await client.producer(queue, group_id=group).send_batch(["b0", "b1"])
            await found.wait(2)
            listing = await client.cluster_groups(queue, group=group)
        assert in_order(found, {group: ["b0", "b1"]}) == {group: "n1"}
        assert [(g.node, g.bound) for g in listing.groups] == [("n1", True)]
        assert listing.unreachable == ["n3: not connected"]
    finally:
        await found.close()
        for client in clients:
            await client.close()


async def test_a_restarted_local_node_drops_bindings_to_a_queue_that_never_returns(
    tmp_path: Path, own: list[ClusterNodes]
) -> None:
    # The timeout is long enough for the restart and the traffic below to fit inside it, so the
    # test sees the stale bindings still held while unrelated traffic already flows.
    nodes = ClusterNodes(tmp_path, grouping(NODES, timeout=15000))
    own.append(nodes.start())
    queue = unique("lrestart")
    await create_everywhere(nodes, queue)
    groups = [f"{queue}-g{i}" for i in range(4)]
    owner, _ = await bind_then_stop_all(nodes, queue, groups, ["n2", "n3"], "n1")
    gone = sorted(g for g, n in owner.items() if n == "n3")
    kept = sorted(g for g, n in owner.items() if n == "n2")
    assert gone and kept, owner
    nodes.start("n1", "n2")  # n3 never comes back
    second, clients = Collector(), []
    try:
        # While the LOCAL node waits for n3's queue, clients connect and other groups flow.
        await consumers_on(nodes, queue, ["n1", "n2"], second, clients)
        fresh = f"{queue}-fresh"
        async with nodes.client("n1") as client:
            for group in [*kept, fresh]:
                await client.producer(queue, group_id=group).send("during")
            await second.wait(len(kept) + 1)
            listing = await client.cluster_groups(queue)
        during = in_order(second, {g: ["during"] for g in [*kept, fresh]})
        assert all(during[g] == "n2" for g in kept), during
        held = {g.group: g.node for g in listing.groups if g.bound}
        assert all(held.get(g) == "n3" for g in gone), f"stale bindings dropped too early: {held}"

        async def dropped() -> bool:
            async with nodes.client("n2") as client:
                listing = await client.cluster_groups(queue)
            bound = {g.group for g in listing.groups if g.bound}
            return not bound.intersection(gone)

        await until(dropped, "the bindings to n3's queue to be dropped")
        async with nodes.client("n2") as client:
            for group in gone:
                await client.producer(queue, group_id=group).send_batch(["after0", "after1"])
            await second.wait(len(kept) + 1 + 2 * len(gone))
            listing = await client.cluster_groups(queue)
        moved = in_order(
            second,
            {**{g: ["during"] for g in [*kept, fresh]}, **{g: ["after0", "after1"] for g in gone}},
        )
        rebound = {g.group: g.node for g in listing.groups if g.bound}
        assert all(moved[g] == rebound[g] and rebound[g] in ("n1", "n2") for g in gone), rebound
    finally:
        await second.close()
        for client in clients:
            await client.close()


async def test_group_timeout_frees_idle_groups_and_they_are_proposed_again(
    tmp_path: Path, own: list[ClusterNodes]
) -> None:
    spec = grouping(["n1", "n2"], timeout=2000, group_timeout=600, reaper_period=200)
    nodes = ClusterNodes(tmp_path, spec)
    own.append(nodes.start())
    queue, group = unique("idle"), unique("g")
    await create_everywhere(nodes, queue, ["n1", "n2"])
    first, second, clients = Collector(), Collector(), []
    try:
        await consumers_on(nodes, queue, ["n2"], first, clients)
        async with nodes.client("n2") as client:
            await client.producer(queue, group_id=group).send_batch(["a0", "a1"])
            await first.wait(2)
            assert group in {g.group for g in await client.groups(queue)}  # pinned at n2

            async def expired() -> bool:
                table = await client.groups(queue)  # n2 unpins it when told of the removal
                listing = await client.cluster_groups(queue)
                return group not in {g.group for g in table} and listing.groups == []

            await until(expired, "the idle group's binding to be reaped and unpinned")
        assert in_order(first, {group: ["a0", "a1"]}) == {group: "n2"}
        await first.close()
        await consumers_on(nodes, queue, ["n1"], second, clients)
        nodes.wait_consumers(queue, {"n1": 1, "n2": 0})
        async with nodes.client("n2") as client:  # the REMOTE node proposes it afresh
            await client.producer(queue, group_id=group).send_batch(["b0", "b1"])
            await second.wait(2)
            listing = await client.cluster_groups(queue)
        assert in_order(second, {group: ["b0", "b1"]}) == {group: "n1"}
        assert [(g.node, g.bound) for g in listing.groups if g.group == group] == [("n1", True)]
    finally:
        await first.close()
        await second.close()
        for client in clients:
            await client.close()


async def test_with_the_local_node_unreachable_new_groups_fail_cached_ones_flow(
    tmp_path: Path, own: list[ClusterNodes]
) -> None:
    nodes = ClusterNodes(tmp_path, grouping(["n1", "n2"], timeout=1000))
    own.append(nodes.start())
    queue, known = unique("headless"), unique("known")
    await create_everywhere(nodes, queue, ["n1", "n2"])
    collector, clients = Collector(), []
    try:
        await consumers_on(nodes, queue, ["n2"], collector, clients)
        async with nodes.client("n2") as client:
            producer = client.producer(queue, group_id=known)
            await producer.send("k0")
            await collector.wait(1)
            nodes.stop("n1", signal.SIGKILL)

            await producer.send("k1")  # cached at n2: flows without the LOCAL node
            await collector.wait(2)
            fresh = unique("fresh")
            with pytest.raises(Unavailable) as failed:
                await client.producer(queue, group_id=fresh).send("never")
            message = str(failed.value)
            assert fresh in message and queue in message and "1000 ms" in message, message
            assert "lost or no connection" not in message  # n2 answered: it is the arbiter
            # A batch with a cached and a new group is refused whole: nothing of it enqueued.
            with pytest.raises(Unavailable):
                await client.producer(queue).send_batch(
                    [("k-never", {"JMSXGroupID": known}), ("x", {"JMSXGroupID": unique("new")})]
                )
            frames = await stomp_send(
                nodes.stomp_port("n2"), queue, [("never", {"JMSXGroupID": fresh})]
            )
            assert frames[-1].command == "ERROR", frames
            error = frames[-1].headers["message"]
            assert fresh in error and queue in error and "1000 ms" in error, error
            await producer.send("k2")
            await collector.wait(3)
            assert collector.bodies() == ["k0", "k1", "k2"]  # the refused messages are nowhere
            [info] = [q for q in await client.queues() if q.name == queue]
            assert info.depth == 0 and await sf_depth(client, "n1") == 0
    finally:
        await collector.close()
        for client in clients:
            await client.close()


async def test_two_local_grouping_handlers_are_reported_and_refuse_new_groups(
    tmp_path: Path, own: list[ClusterNodes]
) -> None:
    spec = grouping(["n1", "n2"])
    spec["n2"]["grouping-handler"]["type"] = "LOCAL"
    nodes = ClusterNodes(tmp_path, spec)
    own.append(nodes.start())
    for node_id, other in (("n1", "n2"), ("n2", "n1")):  # each names itself first
        async with nodes.client(node_id) as client:
            problems = (await client.cluster_status()).problems
        assert problems == [f"two LOCAL grouping handlers: {node_id}, {other}"]
        assert nodes.health(node_id, "pinmq.cluster") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert nodes.health(node_id, "") == health_pb2.HealthCheckResponse.SERVING
    async with nodes.client("n1") as client:
        with pytest.raises(Unavailable, match="two LOCAL grouping handlers"):
            await client.producer(unique("q"), group_id="g").send("x")
        await client.producer(unique("q")).send("ungrouped traffic is unaffected")
    nodes.wait_until(
        lambda: "cluster misconfigured" in nodes.nodes["n1"].log(), "the problem to be logged"
    )
