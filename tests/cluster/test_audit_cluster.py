"""The audit log of a real three-node cluster: `routed` events and forwarded messages' `sent`.

n1 runs the LOCAL grouping handler, n2 and n3 REMOTE ones; every node audits. Messages carry
their own `pinmq-mid` and `JMSXGroupSeq` (one producer id per group), so each node event can be
tied to the message, the node it was sent through and its place in the group.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from audit_kinds import events_in
from cluster_nodes import (
    ClusterNodes,
    Collector,
    consumers_on,
    create_everywhere,
    grouping,
    stomp_send,
)
from conftest import unique
from waiting import until

from broker.audit import MID_HEADER
from broker.message import GROUP_ID_HEADER, GROUP_SEQ_HEADER
from pipeline import pure

NODES = ("n1", "n2", "n3")
Events = dict[str, list[dict[str, Any]]]  # node id -> its audit events


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterNodes]:
    spec = grouping(NODES, extra={"audit": {"enabled": True, "flush-ms": 20}})
    nodes = ClusterNodes(tmp_path_factory.mktemp("audited"), spec).start()
    yield nodes
    nodes.kill_all()


async def audit_events(nodes: ClusterNodes, queue: str, settled: int) -> Events:
    """Every node's events about `queue`'s messages (also in SF queues), once `settled` of
    them were acked in `queue` and as many routed (each node's writer flushes every 20 ms on
    its own: an ack on one node can be on disk before the routing on another).
    """
    result: Events = {}
    tag = f"{queue}."

    async def acked() -> bool:
        result.clear()
        for node_id, node in nodes.nodes.items():
            found = events_in(node.data_dir / "audit")
            result[node_id] = [e for e in found if e.get("mid", "").startswith(tag)]
        acks = [e for events in result.values() for e in events if e["kind"] == "acked"]
        routed = sum(e["kind"] == "routed" for events in result.values() for e in events)
        return sum(e["queue"] == queue for e in acks) >= settled and routed >= settled

    await until(f"{settled} acked and routed events in the audit logs", acked)
    return result


async def test_routed_and_sent_events_of_groups_sent_through_remote_and_local_nodes(
    audited: ClusterNodes,
) -> None:
    nodes = audited
    queue = unique("audited")
    await create_everywhere(nodes, queue, NODES)
    collector, clients = Collector(), []
    via: dict[str, str] = {}  # mid -> node it was sent through
    reply_ids: dict[str, int] = {}  # mid -> msg id the node answered
    group_of: dict[str, str | None] = {}  # mid -> its group
    expected: dict[str, list[str]] = {}  # group -> bodies (mids) in order

    def headers(group: str | None, i: int) -> dict[str, str]:
        mid = f"{queue}.{group or 'ungrouped'}/{i}"
        group_of[mid] = group
        return {MID_HEADER: mid} | (
            {GROUP_ID_HEADER: group, GROUP_SEQ_HEADER: str(i)} if group else {}
        )

    def mid_of(group: str, i: int) -> str:
        return f"{queue}.{group}/{i}"

    async def send(node_id: str, group: str | None, seqs: range) -> None:
        items = [(h[MID_HEADER], h) for h in (headers(group, i) for i in seqs)]
        async with nodes.client(node_id) as client:
            ids = await client.producer(queue).send_batch(items)
        for (body, _), msg_id in zip(items, ids, strict=True):
            via[body], reply_ids[body] = node_id, msg_id
            if group is not None:
                expected.setdefault(group, []).append(body)

    try:
        await consumers_on(nodes, queue, NODES, collector, clients)
        remote_first = [f"r{i}" for i in range(6)]  # new groups through a REMOTE node
        local_first = [f"l{i}" for i in range(6)]  # new groups through the LOCAL node
        for group in remote_first:
            await send("n2", group, range(1, 4))
        for group in local_first:
            await send("n1", group, range(1, 4))
        for group in remote_first:  # known groups, through the LOCAL node and the others
            await send("n1", group, range(4, 6))
            await send("n3", group, range(6, 8))
        for group in local_first:
            await send("n2", group, range(4, 6))
        await send("n2", None, range(1, 7))
        stomp = [headers("s0", i) for i in range(1, 4)]  # STOMP takes the same send path
        frames = await stomp_send(
            nodes.stomp_port("n3"), queue, [(h[MID_HEADER], h) for h in stomp]
        )
        assert frames[-1].command == "RECEIPT", frames
        expected["s0"] = [h[MID_HEADER] for h in stomp]
        via.update(dict.fromkeys(expected["s0"], "n3"))
        total = len(via)
        await collector.wait(total)
        owner: dict[str, str] = {}
        for group, mids in collector.per_group().items():
            if group is not None:
                assert [mid for _, mid in mids] == expected[group], f"group {group} reordered"
                assert len({label for label, _ in mids}) == 1, f"group {group} split"
                owner[group] = mids[0][0]
        events = await audit_events(nodes, queue, total)  # before consumers close
    finally:
        await collector.close()
        for client in clients:
            await client.close()

    # One routed event per message, written by the node it was sent through.
    routed = {
        e["mid"]: (node_id, e)
        for node_id, found in events.items()
        for e in found
        if e["kind"] == "routed"
    }
    assert sum(e["kind"] == "routed" for found in events.values() for e in found) == total
    assert {mid: node_id for mid, (node_id, _) in routed.items()} == via
    for mid, msg_id in reply_ids.items():  # the id the client got is the routed message's
        assert routed[mid][1]["msg_id"] == msg_id

    # Grouped: every event of a group names the one queue@node whose consumer got the group,
    # in the arbiter's epoch 1. Ungrouped: no group, epoch or proposal.
    for body, (_, e) in routed.items():
        group = group_of[body]
        assert (e["address"], e["queue"]) == (queue, queue)
        if group is None:
            assert not {"group", "epoch", "new_proposal", "decision_ns"} & e.keys(), e
        else:
            assert (e["group"], e["epoch"]) == (group, 1)
            assert e["target"] == f"{queue}@{owner[group]}", e

    # A new proposal exactly where the node did not know the group: the LOCAL node (the
    # arbiter) only for a group's first message; a REMOTE node for the first message of each
    # group it routes (its cache fills from the LOCAL node's answer), unless the group is
    # bound to it: it learnt the binding when the group's forwarded messages arrived.
    new = {body for body, (_, e) in routed.items() if e.get("new_proposal")}
    assert new == {
        *(mid_of(g, 1) for g in remote_first),  # through n2
        *(mid_of(g, 1) for g in local_first),  # through n1
        *(mid_of(g, 6) for g in remote_first if owner[g] != "n3"),  # n3's first of these
        *(mid_of(g, 4) for g in local_first if owner[g] != "n2"),  # n2's first of these
        mid_of("s0", 1),  # STOMP through n3
    }
    assert all(e["decision_ns"] > 0 for body, (_, e) in routed.items() if body in new)
    assert not any("decision_ns" in e for body, (_, e) in routed.items() if body not in new)

    # Every message is `sent`, delivered and acked once in its queue, on its target node, also
    # when it was forwarded there; the sending node then holds it in that node's SF queue
    # under the routed msg id.
    forwarded = 0
    for body, (sender, e) in routed.items():
        target = e["target"].rpartition("@")[2]
        for kind in ("sent", "delivered", "acked"):
            found = [
                (node_id, x)
                for node_id, xs in events.items()
                for x in xs
                if x["kind"] == kind and x["mid"] == body and x["queue"] == queue
            ]
            assert [node_id for node_id, _ in found] == [target], (body, kind, found)
            assert found[0][1]["node"] == target
        [sent] = [x for x in events[target] if x["kind"] == "sent" and x["mid"] == body]
        if target == sender:
            assert sent["msg_id"] == e["msg_id"]
        else:
            forwarded += 1
            [held] = [x for x in events[sender] if x["kind"] == "sent" and x["mid"] == body]
            assert held["queue"].startswith("$sf.") and held["queue"].endswith(f".{target}")
            assert held["msg_id"] == e["msg_id"]
    assert 0 < forwarded < total  # some went to another node, some stayed

    # The checker's reference pass (pipeline/pure.py, no Spark) reads the three logs clean.
    history = nodes.nodes["n1"].data_dir.parent.parent  # holds every node's data dir
    counts = pure.check(history)
    assert counts == dict.fromkeys(("lost", "duplicates", "order", "exclusivity", "routing"), 0)


async def test_the_local_node_audits_a_removed_binding_and_the_group_may_bind_again(
    audited: ClusterNodes,
) -> None:
    nodes = audited
    queue, group = unique("rebound"), unique("g")
    await create_everywhere(nodes, queue, NODES)
    first, second, clients = Collector(), Collector(), []

    def message(i: int) -> tuple[str, dict[str, str]]:
        mid = f"{queue}.{group}/{i}"
        return mid, {MID_HEADER: mid, GROUP_ID_HEADER: group, GROUP_SEQ_HEADER: str(i)}

    try:
        await consumers_on(nodes, queue, ["n2"], first, clients)  # the only consumer: n2
        async with nodes.client("n3") as client:
            await client.producer(queue).send_batch([message(1)])
        await first.wait(1)
        await first.close()
        await consumers_on(nodes, queue, ["n3"], second, clients)  # now the only one: n3
        nodes.wait_consumers(queue, {"n2": 0, "n3": 1})  # n2's close seen too, or n2 keeps it
        async with nodes.client("n2") as client:
            assert await client.cluster_reset_group(group, queue) == 1
            await client.producer(queue).send_batch([message(2)])
        await second.wait(1)
        events = await audit_events(nodes, queue, 2)
    finally:
        await first.close()
        await second.close()
        for client in clients:
            await client.close()

    unbound = {
        node_id: [
            e
            for e in events_in(node.data_dir / "audit")
            if e["kind"] == "unbound" and e["group"] == group
        ]
        for node_id, node in nodes.nodes.items()
    }
    mine = unbound["n1"]  # the LOCAL node's record; REMOTE nodes only follow it
    assert [(e["queue"], e["target"], e["epoch"], e["reason"]) for e in mine] == [
        (queue, f"{queue}@n2", 1, "unbound")
    ]
    assert unbound["n2"] == unbound["n3"] == []
    routed = sorted(
        (e for found in events.values() for e in found if e["kind"] == "routed"),
        key=lambda e: e["ts_ns"],
    )
    assert [e["target"] for e in routed] == [f"{queue}@n2", f"{queue}@n3"]
    assert routed[0]["ts_ns"] < mine[0]["ts_ns"] < routed[1]["ts_ns"]
    # Bound again after its removal, in the same epoch: not a routing inconsistency.
    history = nodes.nodes["n1"].data_dir.parent.parent
    assert pure.check(history)["routing"] == 0
