"""Clustered grouping through stops, kills, restarts and timeouts: real node processes.

Each scenario starts a cluster of its own (`own`), since it stops, kills or restarts nodes or
needs other grouping settings. Assertions are about where messages went (one consumer per
group, in order, exactly the messages sent), never about timing.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_nodes import (
    NODES,
    ClusterNodes,
    Collector,
    Consuming,
    consumers_on,
    create_everywhere,
    grouping,
    in_order,
    stomp_send,
)
from conftest import cli, depth, get, unique
from grpc_health.v1 import health_pb2
from waiting import until

from broker.client import Client, PinmqError, RefusedForNow, Unavailable


@pytest.fixture
def own(tmp_path: Path) -> Iterator[list[ClusterNodes]]:
    """Clusters a destructive scenario starts for itself (`own.append(ClusterNodes(...))`)."""
    started: list[ClusterNodes] = []
    yield started
    for nodes in started:
        nodes.kill_all()


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

            await until("n1's store-and-forward queue to drain", drained)
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


@pytest.mark.slow
async def test_the_whole_cluster_restarts_and_its_bindings_hold(
    tmp_path: Path,
    own: list[ClusterNodes],
    consuming: Consuming,
) -> None:
    nodes = ClusterNodes(tmp_path, grouping(NODES, timeout=30000))
    own.append(nodes.start())
    queue = unique("restart")
    await create_everywhere(nodes, queue)
    groups = [f"{queue}-g{i}" for i in range(6)]
    owner, bound = await bind_then_stop_all(nodes, queue, groups, NODES, "n2")
    assert owner == bound and len(set(owner.values())) == 3
    nodes.start()
    second = consuming.collector()
    clients = consuming.clients
    await consumers_on(nodes, queue, NODES, second, clients)
    async with nodes.client("n3") as client:  # a REMOTE node with an empty cache
        for group in groups:
            await client.producer(queue, group_id=group).send("after")
        listing = await client.cluster_groups(queue)
    await second.wait(len(groups))
    assert in_order(second, {g: ["after"] for g in groups}) == owner
    assert {g.group: g.node for g in listing.groups if g.bound} == bound


@pytest.mark.slow
async def test_a_group_bound_to_a_dead_node_waits_for_it_and_moves_only_when_forced(
    tmp_path: Path, own: list[ClusterNodes]
) -> None:
    nodes = ClusterNodes(tmp_path, grouping(NODES, timeout=500))
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
        for node_id in ("n1", "n2"):  # they know n3 is gone: from here on it is absent
            nodes.wait(
                f"{node_id} to see n3 gone",
                lambda n=node_id: not nodes.view(n)["n3"]["connected"],
            )
        await consumers_on(nodes, queue, ["n1"], found, clients)
        await asyncio.sleep(1.5)  # absent 3x the handler timeout: absence alone never re-binds
        async with nodes.client("n2") as client:
            await client.producer(queue, group_id=group).send("waits")  # for n3, in SF
            listing = await client.cluster_groups(queue, group=group)
            assert [(g.node, g.bound) for g in listing.groups] == [("n3", True)]
            with pytest.raises(PinmqError, match=r"bound to \S+@n3, which is not connected") as err:
                await client.cluster_reset_group(group, queue)
            assert err.value.code == "FAILED_PRECONDITION"
            assert await sf_depth(client, "n3") == 1
        reset = ["reset-groups", queue, "--cluster", "--group", group, "--url", nodes.url("n2")]
        refused = await asyncio.to_thread(cli, *reset)
        assert refused.returncode == 1 and "--force" not in refused.stdout
        assert f"{queue}@n3, which is not connected" in refused.stderr
        forced = await asyncio.to_thread(cli, *reset, "--force")
        assert forced.returncode == 0, forced.stderr
        assert f"warning: {group} is bound to {queue}@n3, which is not connected." in forced.stderr
        assert "The group's order is not kept across this move" in forced.stderr
        assert f"unbound group {group} on {queue} cluster-wide (1 binding(s) removed)" in (
            forced.stdout
        )
        async with nodes.client("n1") as client:
            await client.producer(queue, group_id=group).send_batch(["b0", "b1"])
            await found.wait(2)
            listing = await client.cluster_groups(queue, group=group)
        assert in_order(found, {group: ["b0", "b1"]}) == {group: "n1"}
        assert [(g.node, g.bound) for g in listing.groups] == [("n1", True)]
        assert listing.unreachable == ["n3: not connected"]
        # n3 returns with a consumer: the message that waited for it in n2's store-and-forward
        # queue is not delivered there but follows the group to n1, after its newer ones.
        nodes.start("n3")
        back = Collector()
        await consumers_on(nodes, queue, ["n3"], back, clients)
        await found.wait(3, "(the waiting message moved to n1)")
        got = [(label, m.body.decode()) for label, m in found.got]
        assert got[:2] == [("n1", "b0"), ("n1", "b1")] and got[-1] == ("n1", "waits"), got
        assert {body for _, body in got[2:-1]} <= {"a0", "a1"}, got  # unacked when n3 died

        async def settled_at_n3() -> bool:  # nothing on its way to n3, nothing held there
            async with nodes.client("n2") as n2, nodes.client("n3") as n3:
                held = [c.unacked for c in await n3.consumers(queue)]
                return await sf_depth(n2, "n3") == 0 and await depth(n3, queue) == 0 == sum(held)

        await until("n3 to hold nothing", settled_at_n3)
        assert back.got == []  # what n3 delivered, its consumer took before acking it
        await back.close()
    finally:
        await found.close()
        for client in clients:
            await client.close()


@pytest.mark.slow
async def test_a_restarted_local_node_keeps_bindings_to_a_queue_that_stays_away(
    tmp_path: Path,
    own: list[ClusterNodes],
    consuming: Consuming,
) -> None:
    nodes = ClusterNodes(tmp_path, grouping(NODES, timeout=500))
    own.append(nodes.start())
    queue = unique("lrestart")
    await create_everywhere(nodes, queue)
    groups = [f"{queue}-g{i}" for i in range(4)]
    owner, _ = await bind_then_stop_all(nodes, queue, groups, ["n2", "n3"], "n1")
    gone = sorted(g for g, n in owner.items() if n == "n3")
    kept = sorted(g for g, n in owner.items() if n == "n2")
    assert gone and kept, owner
    nodes.start("n1", "n2")  # n3 stays away
    second = consuming.collector()
    clients = consuming.clients
    # While n3's queue is away, clients connect and the other groups flow.
    await consumers_on(nodes, queue, ["n1", "n2"], second, clients)
    fresh = f"{queue}-fresh"
    async with nodes.client("n1") as client:
        for group in [*kept, fresh]:
            await client.producer(queue, group_id=group).send("during")
        await second.wait(len(kept) + 1)
    during = in_order(second, {g: ["during"] for g in [*kept, fresh]})
    assert all(during[g] == "n2" for g in kept), during
    await asyncio.sleep(1.5)  # 3x the handler timeout
    async with nodes.client("n2") as client:
        listing = await client.cluster_groups(queue)
        held = {g.group: g.node for g in listing.groups if g.bound}
        assert all(held.get(g) == "n3" for g in gone), f"bindings to n3 dropped: {held}"
        for group in gone:
            await client.cluster_reset_group(group, queue, force=True)
            await client.producer(queue, group_id=group).send_batch(["after0", "after1"])
        await second.wait(len(kept) + 1 + 2 * len(gone))
        listing = await client.cluster_groups(queue)
    moved = in_order(
        second,
        {**{g: ["during"] for g in [*kept, fresh]}, **{g: ["after0", "after1"] for g in gone}},
    )
    rebound = {g.group: g.node for g in listing.groups if g.bound}
    assert all(moved[g] == rebound[g] and rebound[g] in ("n1", "n2") for g in gone), rebound


async def test_group_timeout_frees_idle_groups_and_they_are_proposed_again(
    tmp_path: Path,
    own: list[ClusterNodes],
    consuming: Consuming,
) -> None:
    spec = grouping(["n1", "n2"], timeout=2000, group_timeout=600, reaper_period=200)
    nodes = ClusterNodes(tmp_path, spec)
    own.append(nodes.start())
    queue, group = unique("idle"), unique("g")
    await create_everywhere(nodes, queue, ["n1", "n2"])
    first, second = consuming.collector(), consuming.collector()
    clients = consuming.clients
    await consumers_on(nodes, queue, ["n2"], first, clients)
    async with nodes.client("n2") as client:
        await client.producer(queue, group_id=group).send_batch(["a0", "a1"])
        await first.wait(2)
        assert group in {g.group for g in await client.groups(queue)}  # pinned at n2

        async def expired() -> bool:
            table = await client.groups(queue)  # n2 unpins it when told of the removal
            listing = await client.cluster_groups(queue)
            return group not in {g.group for g in table} and listing.groups == []

        await until("the idle group's binding to be reaped and unpinned", expired)
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


async def test_with_the_local_node_unreachable_new_groups_fail_cached_ones_flow(
    tmp_path: Path,
    own: list[ClusterNodes],
    consuming: Consuming,
) -> None:
    nodes = ClusterNodes(tmp_path, grouping(["n1", "n2"], timeout=1000))
    own.append(nodes.start())
    queue, known = unique("headless"), unique("known")
    await create_everywhere(nodes, queue, ["n1", "n2"])
    collector = consuming.collector()
    clients = consuming.clients
    await consumers_on(nodes, queue, ["n2"], collector, clients)
    async with nodes.client("n2") as client:
        producer = client.producer(queue, group_id=known)
        await producer.send("k0")
        await collector.wait(1)
        nodes.stop("n1", signal.SIGKILL)

        await producer.send("k1")  # cached at n2: flows without the LOCAL node
        await collector.wait(2)
        fresh = unique("fresh")
        with pytest.raises(RefusedForNow) as failed:
            await client.producer(queue, group_id=fresh).send("never")
        message = str(failed.value)
        assert fresh in message and queue in message and "1000 ms" in message, message
        assert message.startswith(f"refused by {nodes.url('n2')}: "), message  # n2 answered
        assert isinstance(failed.value, Unavailable)  # a retry may succeed
        # A batch with a cached and a new group is refused whole: nothing of it enqueued.
        with pytest.raises(RefusedForNow):
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
    nodes.wait(
        "the problem to be logged",
        lambda: "cluster misconfigured" in nodes.nodes["n1"].log(),
    )


async def test_a_frozen_peer_is_noticed_logged_and_linked_again_when_it_thaws(
    tmp_path: Path, own: list[ClusterNodes]
) -> None:
    nodes = ClusterNodes(tmp_path, grouping(NODES))
    own.append(nodes.start())
    frozen = nodes.nodes["n2"].proc
    assert frozen is not None
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        # Its sockets stay open: only the keepalive pings of the links find it out.
        for node_id in ("n1", "n3"):
            nodes.wait(
                f"{node_id} to see the frozen n2 as disconnected",
                lambda n=node_id: not nodes.view(n)["n2"]["connected"],
            )
        nodes.wait(
            "a warning naming the frozen peer",
            lambda: any(
                '"cluster peer not answering"' in line and '"peer": "n2"' in line
                for n in ("n1", "n3")
                for line in nodes.nodes[n].log().splitlines()
            ),
        )
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    nodes.wait_linked()
    assert all(v["connected"] for v in nodes.view("n1").values())


@pytest.mark.slow
async def test_a_paged_group_moved_while_its_node_was_down_follows_its_binding(
    tmp_path: Path, own: list[ClusterNodes]
) -> None:
    """n3 pages a backlog (its address holds 8 KiB in memory). While n3 is down, one group
    of the backlog is forced to n1. When n3 returns, that group's messages come back from
    n3's page into memory: they must follow the group to n1, never reach n3's consumer."""
    queue = unique("pagedmove")
    spec = grouping(NODES, timeout=500)
    spec["n3"] = {**spec["n3"], "address-settings": {"#": {}, queue: {"max-size-bytes": 8192}}}
    nodes = ClusterNodes(tmp_path, spec)
    own.append(nodes.start())
    filler, moved = unique("filler"), unique("moved")
    await create_everywhere(nodes, queue)
    first, found, back, clients = Collector(), Collector(), Collector(), []
    try:
        await consumers_on(nodes, queue, ["n3"], first, clients)  # binds both groups to n3
        async with nodes.client("n3") as client:
            for group in (filler, moved):
                await client.producer(queue, group_id=group).send("bind")
            await first.wait(2)
        await first.close()
        nodes.wait_consumers(queue, {"n3": 0})
        async with nodes.client("n3") as client:
            await client.producer(queue, group_id=filler).send_batch([b"f" * 1024] * 20)
            await client.producer(queue, group_id=moved).send_batch(["p0", "p1", "p2"])
            status = get(nodes.nodes["n3"].http, "/readyz")[1]["resources"]
            assert status["paging_queues"] == [queue] and status["paged_messages"] >= 3
        nodes.stop("n3")
        await consumers_on(nodes, queue, ["n1"], found, clients)
        async with nodes.client("n2") as client:
            await client.cluster_reset_group(moved, queue, force=True)
        async with nodes.client("n1") as client:
            await client.producer(queue, group_id=moved).send_batch(["b0", "b1"])
        await found.wait(2)
        nodes.start("n3")
        await consumers_on(nodes, queue, ["n3"], back, clients)
        await back.wait(20, "(the filler group, still bound to n3)")
        await found.wait(5, "(the paged messages moved to n1)")
        got = [m.body.decode() for _, m in found.got]
        assert got == ["b0", "b1", "p0", "p1", "p2"], got
        assert {m.group_id for _, m in back.got} == {filler}
    finally:
        await back.close()
        await found.close()
        for client in clients:
            await client.close()
