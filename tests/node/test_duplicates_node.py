"""Duplicate detection on a real node: a message sent again with the same `_AMQ_DUPL_ID`, over
gRPC or STOMP, is confirmed and delivered once, also after the node was killed with SIGKILL
and restarted on its data dir (the ids are in its store), and in a two-node cluster, where
the node the client sent to decides.

Whether a duplicate was enqueued is seen without waiting for its absence: every check ends
with a marker message sent after the duplicates, in their order (one queue and one consumer;
in the cluster, one group), so a duplicate that had been enqueued would come before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_nodes import ClusterNodes, Collector, consumers_on, create_everywhere, grouping
from cluster_nodes import stomp_send as stomp_send_raw
from conftest import NodeProcess, get, unique
from stomp_helpers import Recorder, stomp_connections, subscribe

from broker.client import Client
from broker.message import DUPLICATE_ID_HEADER, GROUP_ID_HEADER

DUP = DUPLICATE_ID_HEADER
RECEIVE_S = 10.0


async def drain_until(client: Client, queue: str, marker: str) -> list[str]:
    """Bodies received (and acked) on `queue` up to and including `marker`."""
    got: list[str] = []
    async with client.consumer(queue) as consumer:
        while not got or got[-1] != marker:
            m = await consumer.receive(RECEIVE_S)
            assert m is not None, f"no {marker!r} after {got}"
            got.append(m.body.decode())
            await m.ack()
    return got


def dropped(node: NodeProcess) -> int:
    return get(node.http, "/readyz")[1]["resources"]["duplicates_dropped"]


async def test_grpc_a_resent_id_is_delivered_once_also_after_kill_9(
    node_factory: Callable[..., NodeProcess],
) -> None:
    node = node_factory()
    q = unique()
    async with Client(node.url) as client:
        producer = client.producer(q)
        first = await producer.send("first", {DUP: "order-1"})
        assert await producer.send("first, sent again", {DUP: "order-1"}) == first
        ids = await producer.send_batch(
            [("b", {DUP: "b-1"}), ("b, twice in its batch", {DUP: "b-1"}), ("c", {DUP: "c-1"})]
        )
        assert ids[1] == ids[0] and len(set(ids)) == 2
        await producer.send("marker-1")
        assert await drain_until(client, q, "marker-1") == ["first", "b", "c", "marker-1"]
        pending = await producer.send("pending", {DUP: "p-1"})  # left in the queue
    assert dropped(node) == 2

    node.kill()  # SIGKILL: no clean stop, the store is as the last commit left it
    node.start()
    async with Client(node.url) as client:
        producer = client.producer(q)
        # Consumed or not, each id is still known: the original's msg id, nothing enqueued.
        assert await producer.send("first, after the crash", {DUP: "order-1"}) == first
        assert await producer.send("pending, after the crash", {DUP: "p-1"}) == pending
        again = await producer.send_batch([("c again", {DUP: "c-1"}), ("new", {DUP: "n-1"})])
        assert again[0] == ids[2] and again[1] > pending  # msg ids go on after the store's
        await producer.send("marker-2")
        assert await drain_until(client, q, "marker-2") == ["pending", "new", "marker-2"]
    assert dropped(node) == 3  # counted since this start


async def test_a_non_persistent_message_id_is_remembered_until_a_restart(
    node_factory: Callable[..., NodeProcess],
) -> None:
    node = node_factory()
    q = unique()
    async with Client(node.url) as client:
        producer = client.producer(q, persistent=False)
        first = await producer.send("m", {DUP: "np-1"})
        assert await producer.send("m again", {DUP: "np-1"}) == first
        await producer.send("marker")
        assert await drain_until(client, q, "marker") == ["m", "marker"]
    # Like the message, its id was in memory only: after a restart the id is new again.
    node.kill()
    node.start()
    async with Client(node.url) as client:
        producer = client.producer(q, persistent=False)
        await producer.send("m after the restart", {DUP: "np-1"})
        await producer.send("marker")
        assert await drain_until(client, q, "marker") == ["m after the restart", "marker"]


async def test_detection_off_delivers_every_copy(
    node_factory: Callable[..., NodeProcess],
) -> None:
    node = node_factory({"limits": {"id-cache-size": 0}})
    q = unique()
    async with Client(node.url) as client:
        producer = client.producer(q)
        a = await producer.send("a", {DUP: "x"})
        assert await producer.send("a", {DUP: "x"}) != a
        await producer.send("marker")
        assert await drain_until(client, q, "marker") == ["a", "a", "marker"]
    assert dropped(node) == 0


# ---- STOMP ---------------------------------------------------------------------------------


@pytest.fixture
def stomp_connect() -> Iterator[Callable[[NodeProcess], tuple[Any, Recorder]]]:
    """stomp.py 1.2 connections to a node's STOMP port; all are closed at the end."""
    with stomp_connections() as make:
        yield lambda node: make(node.stomp_port)


def stomp_send(conn: Any, rec: Recorder, queue: str, body: str, **headers: str) -> None:
    """A persistent SEND; waits for its RECEIPT (an ERROR instead fails the wait)."""
    receipt = unique("r")
    conn.send(
        f"/queue/{queue}", body, headers={"persistent": "true", "receipt": receipt, **headers}
    )
    rec.wait(lambda: receipt in rec.receipts or bool(rec.errors), f"receipt {receipt}")
    assert not rec.errors, [e.body for e in rec.errors]


def stomp_drain_until(conn: Any, rec: Recorder, queue: str, marker: str) -> list[str]:
    """Subscribe (ack auto), take messages up to `marker`, unsubscribe; their bodies."""
    sub = unique("sub")
    subscribe(conn, rec, queue, sub, ack="auto")
    rec.wait(lambda: any(m.body == marker for m in rec.messages), f"message {marker!r}")
    bodies = [m.body for m in rec.messages]
    rec.messages.clear()
    conn.unsubscribe(sub)
    return bodies


def test_stomp_a_resent_id_is_delivered_once_also_after_kill_9(
    node_factory: Callable[..., NodeProcess],
    stomp_connect: Callable[[NodeProcess], tuple[Any, Recorder]],
) -> None:
    node = node_factory()
    q = unique()
    conn, rec = stomp_connect(node)
    stomp_send(conn, rec, q, "first", **{DUP: "s-1"})
    stomp_send(conn, rec, q, "first, sent again", **{DUP: "s-1"})  # a RECEIPT, no ERROR
    # In one transaction, the later of two messages with one id is dropped too.
    conn.begin("tx")
    conn.send(f"/queue/{q}", "t", headers={"persistent": "true", DUP: "t-1", "transaction": "tx"})
    conn.send(f"/queue/{q}", "t again", headers={DUP: "t-1", "transaction": "tx"})
    receipt = unique("commit")
    conn.commit("tx", headers={"receipt": receipt})
    rec.wait_receipt(receipt)
    stomp_send(conn, rec, q, "pending", **{DUP: "p-1"})
    stomp_send(conn, rec, q, "marker-1")
    assert stomp_drain_until(conn, rec, q, "marker-1") == ["first", "t", "pending", "marker-1"]
    stomp_send(conn, rec, q, "kept", **{DUP: "k-1"})  # not consumed before the crash
    assert dropped(node) == 2

    node.kill()
    node.start()
    conn, rec = stomp_connect(node)
    stomp_send(conn, rec, q, "first, after the crash", **{DUP: "s-1"})
    stomp_send(conn, rec, q, "kept, after the crash", **{DUP: "k-1"})
    stomp_send(conn, rec, q, "t, after the crash", **{DUP: "t-1"})
    stomp_send(conn, rec, q, "marker-2")
    assert stomp_drain_until(conn, rec, q, "marker-2") == ["kept", "marker-2"]
    assert dropped(node) == 3


# ---- a cluster -----------------------------------------------------------------------------


async def test_the_entry_node_of_a_cluster_drops_a_resent_id_and_the_target_never_screens(
    tmp_path: Path,
) -> None:
    """n1 forwards a group bound to n2's consumer: resends through n1 are dropped there, over
    gRPC and STOMP; n2 enqueues what n1 forwards even when a client had sent n2 that id."""
    pair = ("n1", "n2")
    nodes = ClusterNodes(tmp_path, grouping(pair)).start()
    collector, clients = Collector(), []
    try:
        q, g = unique("dup"), unique("g")
        await create_everywhere(nodes, q, pair)
        await consumers_on(nodes, q, ("n2",), collector, clients)  # the group binds to n2
        async with nodes.client("n2") as client:  # n2 has seen "both" from a client
            await client.producer(q, group_id=g).send("direct to n2", {DUP: "both"})
        await collector.wait(1)
        async with nodes.client("n1") as client:
            producer = client.producer(q, group_id=g)
            first = await producer.send("a", {DUP: "c-1"})
            assert await producer.send("a again", {DUP: "c-1"}) == first
            ids = await producer.send_batch([("b", {DUP: "c-2"}), ("b again", {DUP: "c-2"})])
            assert ids[0] == ids[1]
            await producer.send("through n1", {DUP: "both"})  # new to n1: forwarded, kept
        sends = [("c", {DUP: "c-3"}), ("c again", {DUP: "c-3"}), ("a, STOMP", {DUP: "c-1"})]
        frames = await stomp_send_raw(
            nodes.stomp_port("n1"), q, [(body, {**h, GROUP_ID_HEADER: g}) for body, h in sends]
        )
        assert frames[-1].command == "RECEIPT", frames
        async with nodes.client("n1") as client:
            await client.producer(q, group_id=g).send("marker")
        await collector.wait(6)
        assert collector.bodies() == ["direct to n2", "a", "b", "through n1", "c", "marker"]
    finally:
        await collector.close()
        for client in clients:
            await client.close()
        nodes.kill_all()
