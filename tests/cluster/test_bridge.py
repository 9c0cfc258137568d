"""Store-and-forward between nodes: marks in the store, the core's deliver_to, and real transfers.

The sending node runs in-process (the send path does not call `forward` yet, so the tests do);
the receiving node is a real `pinmq node` process that can be killed, and its queue is consumed
with the Python client.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import NodeProcess
from grpc import aio
from ports import reserve_port
from waiting import until

from broker.client import Client, Received
from broker.config import NodeConfig, QueueConfig
from broker.core import ORIGINAL_QUEUE_HEADER, BrokerCore
from broker.effects import Effects
from broker.message import Message, Outgoing
from broker.store import Store
from cluster.bridge import FORWARD_HEADER, sf_queue
from cluster.member import ClusterMember
from pinmq.node import Node
from pinmq_pb import cluster_pb2 as cpb
from pinmq_pb import cluster_pb2_grpc as cpb_grpc

WAIT_S = 20.0

# ---- store: marks ---------------------------------------------------------------------------


def _msg(msg_id: int, queue: str = "q") -> Message:
    return Message(msg_id=msg_id, queue=queue, address=queue, body=b"x", persistent=True)


async def test_marks_commit_with_messages_and_never_go_down(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.db")
    try:
        assert store.load_marks() == {}
        await store.write(added=[_msg(1), _msg(2)], marks={"a/1": 7})
        await store.write(marks={"a/1": 5, "b/2": 3})  # a lower mark is ignored
        assert store.load_marks() == {"a/1": 7, "b/2": 3}
        assert [m.msg_id for m in store.load_messages()] == [1, 2]
        # Several writes in one group commit: the highest mark wins whatever the order.
        await asyncio.gather(
            store.write(added=[_msg(3)], marks={"a/1": 9}), store.write(marks={"a/1": 8})
        )
        assert store.load_marks()["a/1"] == 9
        store_id = store.store_id()
    finally:
        await store.close()
    reopened = Store.open(tmp_path / "s.db")
    try:
        assert reopened.load_marks() == {"a/1": 9, "b/2": 3}
        assert reopened.store_id() == store_id > 0
    finally:
        await reopened.close()
    other = Store.open(tmp_path / "other.db")
    try:
        assert other.store_id() != store_id  # a wiped data dir is a new origin to its peers
    finally:
        await other.close()


# ---- core: deliver_to -----------------------------------------------------------------------


def _core(**settings: Any) -> BrokerCore:
    config: dict[str, Any] = {"node": {"id": "t"}}
    if settings:
        config["address-settings"] = {"#": settings}
    return BrokerCore(NodeConfig.model_validate(config))


def test_deliver_to_targets_the_named_queue_not_the_address_routing() -> None:
    core = _core()
    core.create_queue("a", "q1", QueueConfig())
    core.create_queue("a", "q2", QueueConfig())
    ids = []
    for _ in range(3):
        msg_id, fx = core.deliver_to("q2", Outgoing("a", b"x", {}, True), 1)
        assert [m.queue for m in fx.added] == ["q2"] and not fx.queues_created
        ids.append(msg_id)
    assert ids == sorted(ids) and core.queue("q2").depth == 3 and core.queue("q1").depth == 0
    send_id, _ = core.send(Outgoing("a", b"y", {}, True), 2)
    assert send_id > ids[-1]  # one id sequence for both paths


def test_deliver_to_auto_creates_the_queue_per_address_settings() -> None:
    core = _core(**{"default-group-buckets": 4})
    msg_id, fx = core.deliver_to("orders.eu", Outgoing("orders", b"x", {"h": "v"}, True), 1)
    assert msg_id is not None
    [(address, name, settings)] = fx.queues_created
    assert (address, name, settings.group_buckets) == ("orders", "orders.eu", 4)
    assert [q.name for q in core.queues_of("orders")] == ["orders.eu"]
    assert fx.added[0].headers == {"h": "v"} and fx.added[0].address == "orders"


def test_deliver_to_without_auto_create_dead_letters_or_drops() -> None:
    core = _core(**{"auto-create-queues": False, "dead-letter-address": "DLQ"})
    core.create_queue("DLQ", "DLQ", QueueConfig())
    msg_id, fx = core.deliver_to("gone", Outgoing("a", b"x", {}, True), 1)
    assert msg_id is not None and [m.queue for m in fx.added] == ["DLQ"]
    assert fx.added[0].headers[ORIGINAL_QUEUE_HEADER] == "gone"
    nowhere = _core(**{"auto-create-queues": False, "dead-letter-address": None})
    assert nowhere.deliver_to("gone", Outgoing("a", b"x", {}, True), 1) == (None, Effects())


def test_internal_queue_is_created_once() -> None:
    core = _core()
    settings = QueueConfig(group_buckets=0)
    assert len(core.ensure_internal_queue("$sf.c.n2", settings).queues_created) == 1
    assert core.ensure_internal_queue("$sf.c.n2", settings).queues_created == []
    assert core.queue("$sf.c.n2").address == "$sf.c.n2"


# ---- transfers between nodes ------------------------------------------------------------------


class Sender:
    """An in-process node `a`, restartable on the same data dir and ports."""

    def __init__(self, tmp_path: Path, peer_cluster: str) -> None:
        self.cluster_addr = f"127.0.0.1:{reserve_port()}"
        self.config = NodeConfig.model_validate(
            {
                "node": {"id": "a", "data-dir": str(tmp_path / "a")},
                "listen": {
                    "client": f"127.0.0.1:{reserve_port()}",
                    "stomp": f"127.0.0.1:{reserve_port()}",
                    "http": f"127.0.0.1:{reserve_port()}",
                    "cluster": self.cluster_addr,
                },
                "cluster": {"connectors": [peer_cluster], "reconnect-interval": 100},
            }
        )
        self.node: Node | None = None

    async def start(self) -> Node:
        self.node = Node(self.config)
        await self.node.start()
        return self.node

    async def stop(self) -> None:
        if self.node is not None:
            node, self.node = self.node, None
            await node.stop(0)

    @property
    def cluster(self) -> ClusterMember:
        assert self.node is not None and self.node.cluster is not None
        return self.node.cluster

    def sf_depth(self, peer: str = "b") -> int:
        assert self.node is not None
        return self.node.engine.queue(sf_queue("pinmq", peer)).depth

    async def forward(self, bodies: list[str], queue: str = "orders", **headers: str) -> None:
        """Forward to b's `queue` and wait until the SF queue holds them durably."""
        assert self.node is not None
        with self.node.engine.unit() as unit:
            for body in bodies:
                message = Outgoing(queue, body.encode(), headers, True)
                unit.place(self.cluster.forwarding("b", queue, message))
        if unit.write is not None:
            await unit.write


def receiver(tmp_path: Path, cluster_addr: str, sender_addr: str) -> NodeProcess:
    workdir = tmp_path / "b"
    workdir.mkdir()
    return NodeProcess(
        workdir,
        {
            "node": {"id": "b"},
            "listen": {"cluster": cluster_addr},
            "cluster": {"connectors": [sender_addr], "reconnect-interval": 100},
        },
    )


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Sender, NodeProcess]]:
    """Sender `a` (in-process, started) and receiver `b` (a process, not started yet)."""
    b_addr = f"127.0.0.1:{reserve_port()}"
    sender = Sender(tmp_path, b_addr)
    b = receiver(tmp_path, b_addr, sender.cluster_addr)
    await sender.start()
    try:
        yield sender, b
    finally:
        b.kill()
        await sender.stop()


async def _consume(url: str, queue: str, n: int, sender: Sender | None = None) -> list[Received]:
    """Receive and ack exactly n messages from `queue`, then check nothing more comes: none
    before the receipt of the last ack (deliveries go first), and once the sender's SF queue
    is empty (nothing more on its way) the queue holds nothing."""
    got: list[Received] = []
    async with Client(url) as client:
        deadline = time.monotonic() + WAIT_S
        while not any(q.name == queue for q in await client.queues()):
            assert time.monotonic() < deadline, f"queue {queue} never appeared"
            await asyncio.sleep(0.02)  # created by the first forwarded message
        consumer = client.consumer(queue, prefetch=500)
        await consumer.start()
        while len(got) < n:
            m = await consumer.receive(WAIT_S)
            assert m is not None, f"only {len(got)} of {n} messages arrived"
            got.append(m)
            await m.ack(wait=len(got) == n)
        extra = await consumer.receive(0)
        assert extra is None, f"an extra message arrived: {extra.body!r} {extra.headers}"
        if sender is not None:
            await until("the SF queue to drain", lambda: sender.sf_depth() == 0)
        [left] = [q.depth for q in await client.queues() if q.name == queue]
        assert left == 0, f"{left} extra messages arrived"
        await consumer.close()
    return got


def _bodies(got: list[Received]) -> list[str]:
    return [m.body.decode() for m in got]


async def test_forwarded_messages_arrive_in_order_exactly_once(
    pair: tuple[Sender, NodeProcess],
) -> None:
    sender, b = pair
    b.start()
    bodies = [f"m{i}" for i in range(3000)]
    for i in range(0, len(bodies), 500):  # the bridge is busy while more arrive
        await sender.forward(bodies[i : i + 500], JMSXGroupID="g1")
    got = await _consume(b.url, "orders", len(bodies), sender)
    assert _bodies(got) == bodies
    seqs = [int(m.headers[FORWARD_HEADER].split(":")[1]) for m in got]
    assert all(m.headers[FORWARD_HEADER].startswith("a:") for m in got)
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert {m.group_id for m in got} == {"g1"}  # grouping applies again at the target queue
    assert sender.cluster.receiver.duplicates == 0


async def test_messages_wait_for_a_down_peer_and_survive_a_sender_restart(
    pair: tuple[Sender, NodeProcess],
) -> None:
    sender, b = pair
    await sender.forward([f"m{i}" for i in range(200)])
    assert sender.sf_depth() == 200
    await sender.stop()  # the messages are on disk only now
    node = await sender.start()
    assert sender.sf_depth() == 200
    assert "b" in sender.cluster.bridges()  # restarted for the waiting messages
    names = [q.name for q in node.engine.queues()]
    assert names == ["$sf.pinmq.b"]
    await sender.forward([f"m{i}" for i in range(200, 300)])
    assert sender.sf_depth() == 300  # b is still down: they wait, and arrive whole after
    b.start()
    got = await _consume(b.url, "orders", 300, sender)
    assert _bodies(got) == [f"m{i}" for i in range(300)]


async def test_receiver_killed_mid_transfer_enqueues_nothing_twice(
    pair: tuple[Sender, NodeProcess],
) -> None:
    sender, b = pair
    b.start()
    bodies: list[str] = []

    async def more(n: int) -> None:
        batch = [f"m{i}" for i in range(len(bodies), len(bodies) + n)]
        bodies.extend(batch)
        await sender.forward(batch)

    await more(2000)
    # Kill -9 while batches are in flight: some are stored at b but not yet acked to a. A fast
    # transfer may finish between two looks, so keep it busy until one look catches it.
    bridge = sender.cluster.bridges()["b"]
    deadline = time.monotonic() + WAIT_S
    while not 0 < bridge.acked < bridge.sent:
        assert time.monotonic() < deadline, "timed out waiting for acks with more in flight"
        if bridge.acked and bridge.acked == bridge.sent:
            await more(500)
        await asyncio.sleep(0.005)
    b.stop(signal.SIGKILL)
    await more(2000)
    b.start()
    got = await _consume(b.url, "orders", len(bodies), sender)
    assert _bodies(got) == bodies
    assert bridge.sent > len(bodies)  # what was in flight at the kill went again


async def test_a_resent_batch_is_dropped_even_after_a_receiver_restart(tmp_path: Path) -> None:
    """Resending what the receiver already stored (as after a lost ack) adds nothing."""
    b_addr = f"127.0.0.1:{reserve_port()}"
    b = receiver(tmp_path, b_addr, f"127.0.0.1:{reserve_port()}").start()
    try:

        def batch(seqs: range, store: int = 11, target: str = "b") -> cpb.ForwardBatch:
            return cpb.ForwardBatch(
                origin="z",
                origin_store=store,
                target_node=target,
                messages=[
                    cpb.ForwardedMessage(
                        seq=s,
                        queue="inbox",
                        address="inbox",
                        body=f"m{s}".encode(),
                        persistent=True,
                    )
                    for s in seqs
                ],
            )

        async def send(*batches: cpb.ForwardBatch) -> list[int]:
            async with aio.insecure_channel(b_addr) as channel:
                call = cpb_grpc.ClusterStub(channel).Forward()
                for x in batches:
                    await call.write(x)
                acks = [(await call.read()).seq for _ in batches]
                call.cancel()
                return acks

        assert await send(batch(range(1, 6))) == [5]
        assert await send(batch(range(3, 9)), batch(range(1, 9))) == [8, 8]
        b.stop(signal.SIGKILL)
        b.start()
        assert await send(batch(range(1, 9)), batch(range(9, 10))) == [8, 9]
        # Another store of origin z (its data dir was wiped): its seq 1 is new.
        assert await send(batch(range(1, 2), store=12)) == [1]
        with pytest.raises(grpc.RpcError) as refused:
            await send(batch(range(1, 2), target="c"))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        got = await _consume(b.url, "inbox", 10)
        assert _bodies(got) == [f"m{i}" for i in range(1, 10)] + ["m1"]
        assert [m.headers[FORWARD_HEADER] for m in got[:2]] == ["z:1", "z:2"]
    finally:
        b.kill()
