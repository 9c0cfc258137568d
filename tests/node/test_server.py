"""End-to-end tests of the node's gRPC server against real node processes."""

from __future__ import annotations

import asyncio
import json
import random
import signal
from collections import defaultdict
from collections.abc import Callable

import grpc
import pytest
from conftest import NodeProcess, unique
from grpc import aio

from broker.client import (
    AlreadyExists,
    Client,
    Consumer,
    InvalidArgument,
    NotFound,
    Received,
)
from pinmq_pb import client_pb2 as pb
from pinmq_pb import client_pb2_grpc as pb_grpc


async def _drain(
    consumer: Consumer, n: int, *, ack: bool = False, timeout: float = 10.0
) -> list[Received]:
    """Receive exactly n messages (acking each if asked); fails if they do not come."""
    got: list[Received] = []
    while len(got) < n:
        m = await consumer.receive(timeout)
        assert m is not None, f"only {len(got)} of {n} messages arrived"
        got.append(m)
        if ack:
            await m.ack()
    return got


async def test_group_order_with_one_consumer(url: str) -> None:
    q = unique()
    async with Client(url) as client:
        producers = [client.producer(q, group_id=f"g{i}") for i in range(3)]
        for _ in range(50):
            for p in producers:
                await p.send_batch([b"x"])
        async with client.consumer(q, prefetch=20) as consumer:
            got = await _drain(consumer, 150, ack=True)
    seqs: dict[str, list[int]] = defaultdict(list)
    for m in got:
        seqs[m.group_id].append(m.group_seq)
        assert m.headers["JMSXGroupID"] == m.group_id
    assert seqs == {f"g{i}": list(range(1, 51)) for i in range(3)}


async def test_three_consumers_each_group_at_one_consumer(url: str) -> None:
    q = unique()
    groups, per_group = 12, 40
    seen: dict[str, list[tuple[str, int]]] = defaultdict(list)
    async with Client(url) as client:
        await client.create_queue(q)
        consumers = [client.consumer(q, name=f"c{i}", prefetch=5) for i in range(3)]
        for c in consumers:
            await c.start()
        producers = [client.producer(q, group_id=f"g{i}") for i in range(groups)]
        items = [(p, n) for n in range(per_group) for p in producers]
        await asyncio.gather(
            *(p.send_many([f"{p.group_id}-{k}" for k in range(per_group)]) for p in producers)
        )
        assert len(items) == groups * per_group
        done = asyncio.Event()
        total = 0

        async def run(c) -> None:
            nonlocal total
            while not done.is_set():
                m = await c.receive(0.2)
                if m is None:
                    continue
                seen[m.group_id].append((c.name, m.group_seq))
                await asyncio.sleep(random.random() / 1000)
                await m.ack()
                total += 1
                if total == groups * per_group:
                    done.set()

        await asyncio.wait_for(asyncio.gather(*(run(c) for c in consumers)), 30)
        for c in consumers:
            await c.close()
    assert len(seen) == groups
    owners = set()
    for group, events in seen.items():
        names = {name for name, _ in events}
        assert len(names) == 1, f"{group} was consumed by {names}"
        owners |= names
        assert [seq for _, seq in events] == list(range(1, per_group + 1))
    assert len(owners) == 3, "groups should spread over the three consumers"


async def test_release_redelivers_group_in_order(url: str) -> None:
    q = unique()
    async with Client(url) as client:
        await client.producer(q, group_id="g").send_batch([b"1", b"2", b"3"])
        async with client.consumer(q, prefetch=10) as consumer:
            first = await _drain(consumer, 3)
            assert [m.delivery_count for m in first] == [1, 1, 1]
            await first[0].release(wait=True)
            again = await _drain(consumer, 3)
            assert [m.body for m in again] == [b"1", b"2", b"3"]
            assert [m.delivery_count for m in again] == [2, 2, 2]
            await consumer.ack_many(again, wait=True)
        assert [x.depth for x in await client.queues() if x.name == q] == [0]


async def test_release_drops_buffered_later_messages_of_the_group(url: str) -> None:
    """Messages still buffered in the client come back with the release, not twice."""
    q = unique()
    async with Client(url) as client:
        await client.producer(q, group_id="g").send_batch([b"1", b"2", b"3"])
        async with client.consumer(q, prefetch=10) as consumer:
            first = await consumer.receive(5)
            assert first is not None and first.body == b"1"
            await first.release(wait=True)
            again = await _drain(consumer, 3)
            assert [(m.body, m.delivery_count) for m in again] == [(b"1", 2), (b"2", 2), (b"3", 2)]
            await consumer.ack_many(again, wait=True)
            assert await consumer.receive(0) is None  # deliveries come before the receipt
        assert [x.depth for x in await client.queues() if x.name == q] == [0]


async def test_reject_moves_to_dead_letter_address(url: str) -> None:
    q, dla = unique(), unique("dla")
    async with Client(url) as client:
        await client.create_queue(q, dead_letter_address=dla)
        await client.producer(q).send(b"poison", {"k": "v"})
        async with client.consumer(q) as consumer:
            m = await consumer.receive(5)
            assert m is not None
            await m.reject(wait=True)
        async with client.consumer(dla) as consumer:
            dead = await consumer.receive(5)
            assert dead is not None
            assert dead.body == b"poison"
            assert dead.headers["k"] == "v"
            assert dead.headers["_AMQ_ORIG_QUEUE"] == q
            await dead.ack(wait=True)


async def test_ack_with_receipt_and_unknown_delivery_id(url: str) -> None:
    """Raw protocol: deliveries come batched, receipts follow acks, bad ids end the stream."""
    q = unique()
    async with Client(url) as client:
        await client.producer(q, group_id="g").send_batch([b"a"] * 30)
    async with aio.insecure_channel(url) as channel:
        stub = pb_grpc.BrokerStub(channel)
        call = stub.Consume()
        await call.write(pb.ConsumeRequest(subscribe=pb.Subscribe(queue=q, prefetch=100)))
        assert (await call.read()).WhichOneof("kind") == "subscribed"
        first = await call.read()
        ids = [d.delivery_id for d in first.deliveries.deliveries]
        assert len(ids) > 1, "ready deliveries should be packed into one message"
        await call.write(pb.ConsumeRequest(ack=pb.Settle(delivery_ids=ids, want_receipt=True)))
        while True:
            reply = await call.read()
            if reply.WhichOneof("kind") == "settled":
                break
        assert list(reply.settled.delivery_ids) == ids
        await call.write(pb.ConsumeRequest(ack=pb.Settle(delivery_ids=[10**9])))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            while True:
                await call.read()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown delivery id" in err.value.details()


async def test_admin_create_list_delete(url: str) -> None:
    q, address = unique(), unique("addr")
    async with Client(url) as client:
        await client.create_queue(q, address=address, group_mode="shared", group_buckets=4)
        with pytest.raises(AlreadyExists):
            await client.create_queue(q, address=address)
        info = {x.name: x for x in await client.queues()}[q]
        assert info.address == address
        assert info.settings["group_mode"] == "shared"
        assert info.settings["group_buckets"] == 4
        assert info.settings["group_first_key"] is None
        await client.producer(address).send_batch([b"1", b"2"])
        assert {x.name: x for x in await client.queues()}[q].depth == 2
        assert await client.delete_queue(q) == 2
        assert q not in {x.name for x in await client.queues()}
        with pytest.raises(NotFound):
            await client.delete_queue(q)


async def test_groups_listing_and_reset(url: str) -> None:
    q = unique()
    async with Client(url) as client:
        await client.producer(q, group_id="g").send_batch([b"1", b"2"])
        consumer = client.consumer(q, name="alice", prefetch=10)
        got = await _drain(consumer, 2)
        [g] = await client.groups(q)
        assert (g.group, g.owner, g.owner_name) == ("g", consumer.consumer_id, "alice")
        assert (g.pending, g.outstanding) == (0, 2)
        assert g.last_use is not None
        await consumer.ack_many(got, wait=True)
        [g] = await client.groups(q)
        assert (g.owner_name, g.outstanding) == ("alice", 0)  # sticky: still pinned
        await client.reset_groups(q, "g")
        assert await client.groups(q) == []
        await consumer.close()
        with pytest.raises(NotFound):
            await client.reset_groups(unique())


async def test_closed_consumer_returns_messages_to_group_head(url: str) -> None:
    q = unique()
    async with Client(url) as client:
        await client.producer(q, group_id="g").send_batch([b"1", b"2", b"3"])
        async with client.consumer(q, prefetch=10) as consumer:
            await _drain(consumer, 3)
        [g] = await client.groups(q)
        assert (g.owner, g.pending, g.outstanding) == (None, 3, 0)
        async with client.consumer(q, prefetch=10) as consumer:
            again = await _drain(consumer, 3)
            assert [m.body for m in again] == [b"1", b"2", b"3"]
            await consumer.ack_many(again, wait=True)


async def test_delete_queue_ends_its_consumers(url: str) -> None:
    q = unique()
    async with Client(url) as client:
        await client.create_queue(q)
        consumer = client.consumer(q)
        await consumer.start()
        await client.delete_queue(q)
        with pytest.raises(NotFound, match="deleted"):
            await consumer.receive(5)


async def test_bad_requests(url: str) -> None:
    async with Client(url) as client:
        with pytest.raises(NotFound):
            await client.consumer(unique()).start()
        with pytest.raises(NotFound):
            await client.groups(unique())
        with pytest.raises(InvalidArgument, match="prefetch"):
            await client.consumer(unique(), prefetch=0).start()
        with pytest.raises(InvalidArgument, match="address"):
            await client.producer("").send(b"x")
        with pytest.raises(InvalidArgument, match="group-mode"):
            await client.create_queue(unique(), group_mode="bogus")
        with pytest.raises(InvalidArgument, match="group-buckets"):
            await client.create_queue(unique(), group_buckets=-7)
        with pytest.raises(InvalidArgument, match="unknown queue setting"):
            await client.create_queue(unique(), colour="red")


async def test_oversized_message_is_refused_and_node_keeps_serving(
    node_factory: Callable[..., NodeProcess],
) -> None:
    node = node_factory({"limits": {"max-message-size": 4096}})
    q = unique()
    async with Client(node.url) as client:
        producer = client.producer(q, group_id="g")
        await producer.send_batch([b"a" * 100, b"b" * 100])
        with pytest.raises(InvalidArgument, match=r"exceeds the max-message-size of 4096"):
            await producer.send(b"x" * 5000)
        with pytest.raises(InvalidArgument, match="4096"):  # all or nothing
            await producer.send_batch([b"c" * 100, b"x" * 5000])
        await producer.send(b"d" * 100)
        async with client.consumer(q) as consumer:
            got = await _drain(consumer, 3)
            assert [m.body for m in got] == [b"a" * 100, b"b" * 100, b"d" * 100]
            await consumer.ack_many(got, wait=True)
            assert await consumer.receive(0) is None  # deliveries come before the receipt
        assert [x.depth for x in await client.queues() if x.name == q] == [0]


async def test_auto_create_off_refuses_unknown_address(
    node_factory: Callable[..., NodeProcess],
) -> None:
    node = node_factory(
        {
            "address-settings": {"#": {"auto-create-queues": False}},
            "addresses": {"known": {"queues": {"known": {}}}},
        }
    )
    async with Client(node.url) as client:
        with pytest.raises(NotFound, match="nowhere"):
            await client.producer("nowhere").send_batch([b"x"])
        await client.producer("known").send(b"ok")
        assert {q.name: q.depth for q in await client.queues()} == {"known": 1}


async def test_restart_keeps_persistent_messages_in_order(
    node_factory: Callable[..., NodeProcess],
) -> None:
    node = node_factory()
    q = unique()
    async with Client(node.url) as client:
        await client.create_queue(q, group_mode="shared")
        sent = {}
        for g in ("g1", "g2"):
            p = client.producer(q, group_id=g)
            sent[g] = await p.send_many([f"{g}-{i}" for i in range(300)], batch_size=64)
        await client.producer(q, persistent=False).send(b"volatile")
        # one consumed and acked before the restart, one in flight when it happens
        async with client.consumer(q, prefetch=1) as consumer:
            m = await consumer.receive(5)
            assert m is not None
            await m.ack(wait=True)
        inflight = client.consumer(q, prefetch=1)
        assert await inflight.receive(5) is not None
    assert node.stop(signal.SIGTERM) == 0
    events = [json.loads(line) for line in node.log().splitlines()]
    assert "node stopped" in {e["event"] for e in events}
    assert {e["node"] for e in events} == {f"test-{node.port}"}
    node.start()
    async with Client(node.url) as client:
        info = {x.name: x for x in await client.queues()}[q]
        assert info.settings["group_mode"] == "shared"
        assert info.depth == 599
        async with client.consumer(q, prefetch=50) as consumer:
            got = await _drain(consumer, 598, ack=True)
            got += await _drain(consumer, 1)
            await got[-1].ack(wait=True)  # acks apply in order: all of them
            assert await consumer.receive(0) is None  # deliveries come before the receipt
        assert {x.name: x.depth for x in await client.queues()}[q] == 0
    by_group: dict[str, list[str]] = defaultdict(list)
    for m in got:
        by_group[m.group_id].append(m.body.decode())
    assert by_group["g1"] == [f"g1-{i}" for i in range(1, 300)]
    assert by_group["g2"] == [f"g2-{i}" for i in range(300)]
    assert [m.msg_id for m in got if m.group_id == "g2"] == sent["g2"]


def test_corrupt_store_stops_start_and_is_left_alone(
    node_factory: Callable[..., NodeProcess],
) -> None:
    node = node_factory(start=False)
    node.data_dir.mkdir(parents=True)
    garbage = b"this is not a database" * 100
    node.store_path.write_bytes(garbage)
    node.start(wait=False)
    assert node.wait_exit() != 0
    assert str(node.store_path) in node.log()
    assert node.store_path.read_bytes() == garbage


def test_port_in_use_is_a_clear_startup_error(
    node_factory: Callable[..., NodeProcess], shared_node: NodeProcess
) -> None:
    node = node_factory(start=False)
    node.config_path.write_text(node.config_path.read_text().replace(node.url, shared_node.url))
    node.start(wait=False)
    assert node.wait_exit() != 0
    assert f"cannot listen on {shared_node.url}" in node.log()


async def test_group_first_key_marks_first_message_of_a_group(url: str) -> None:
    q = unique()
    async with Client(url) as client:
        await client.create_queue(q, group_first_key="first")
        await client.producer(q, group_id="g").send_batch([b"1", b"2"])
        async with client.consumer(q) as consumer:
            one, two = await _drain(consumer, 2, ack=True)
    assert one.headers.get("first") == "true"
    assert "first" not in two.headers


async def test_cancelled_stream_closes_its_consumer(url: str) -> None:
    q = unique()
    async with Client(url) as client:
        await client.producer(q, group_id="g").send_batch([b"1", b"2"])
        async with aio.insecure_channel(url) as channel:
            call = pb_grpc.BrokerStub(channel).Consume()
            await call.write(pb.ConsumeRequest(subscribe=pb.Subscribe(queue=q, prefetch=10)))
            await call.read()  # subscribed
            await call.read()  # the deliveries
            [g] = await client.groups(q)
            assert g.outstanding == 2
            call.cancel()
        for _ in range(100):
            [g] = await client.groups(q)
            if g.owner is None:
                break
            await asyncio.sleep(0.05)
        assert (g.owner, g.pending, g.outstanding) == (None, 2, 0)
        assert {x.name: x.consumer_count for x in await client.queues()}[q] == 0
