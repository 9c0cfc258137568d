"""The Python client's producer-side grouping, pipelining, receipts and blocking wrapper."""

from __future__ import annotations

import asyncio

import pytest
from conftest import unique

from broker.client import Client, ConnectionLost, PinmqError, SyncClient


async def test_auto_group_gives_each_producer_its_own_group(url: str) -> None:
    q = unique()
    async with Client(url) as client:
        p1, p2 = client.producer(q, auto_group=True), client.producer(q, auto_group=True)
        assert p1.group_id and p2.group_id and p1.group_id != p2.group_id
        for i in range(3):
            await p1.send(f"a{i}")
            await p2.send(f"b{i}")
        async with client.consumer(q) as consumer:
            got = [await consumer.receive(5) for _ in range(6)]
            await consumer.ack_many([m for m in got if m], wait=True)
    by_group = {
        g: [(m.group_seq, m.text) for m in got if m and m.group_id == g]
        for g in (p1.group_id, p2.group_id)
    }
    assert by_group[p1.group_id] == [(1, "a0"), (2, "a1"), (3, "a2")]
    assert by_group[p2.group_id] == [(1, "b0"), (2, "b1"), (3, "b2")]
    assert all(m and m.headers["JMSXGroupSeq"] == str(m.group_seq) for m in got)


async def test_fixed_group_and_custom_header(url: str) -> None:
    q = unique()
    async with Client(url) as client:
        await client.create_queue(q, group_header="customer")
        producer = client.producer(q, group_id="c-42", group_header="customer")
        ids = await producer.send_batch([b"x", (b"y", {"extra": "1"})])
        assert ids == sorted(ids)
        async with client.consumer(q) as consumer:
            x, y = await consumer.receive(5), await consumer.receive(5)
            assert x is not None and y is not None
            assert (x.group_id, x.headers["customer"], x.group_seq) == ("c-42", "c-42", 1)
            assert (y.group_seq, y.headers["extra"], y.msg_id) == (2, "1", ids[1])
            await consumer.ack_many([x, y], wait=True)
        with pytest.raises(PinmqError, match="already settled"):
            await x.ack()
        with pytest.raises(PinmqError, match="not both"):
            client.producer(q, group_id="g", auto_group=True)


async def test_send_many_pipelines_in_order(url: str) -> None:
    q = unique()
    sent: list[int] = []
    async with Client(url) as client:
        producer = client.producer(q, group_id="g")
        ids = await producer.send_many(
            (f"m{i}" for i in range(3000)), batch_size=100, window=4, on_sent=sent.append
        )
        assert len(ids) == 3000 and ids == sorted(ids) and sum(sent) == 3000
        async with client.consumer(q, prefetch=500) as consumer:
            seqs = []
            while len(seqs) < 3000:
                m = await consumer.receive(5)
                assert m is not None
                seqs.append(m.group_seq)
                await m.ack()
        assert seqs == list(range(1, 3001))


async def test_send_many_reports_a_refused_batch(url: str) -> None:
    async with Client(url) as client:
        with pytest.raises(PinmqError, match="empty address"):
            await client.producer("").send_many([b"x"] * 10)


async def test_consumers_iterate_until_closed(url: str) -> None:
    q = unique()
    async with Client(url) as client:
        await client.producer(q).send_batch([b"1", b"2"])
        consumer = client.consumer(q)
        bodies = []
        async for m in consumer:
            bodies.append(m.body)
            await m.ack()
            if len(bodies) == 2:
                await consumer.close()
        assert bodies == [b"1", b"2"]


async def test_unreachable_url_names_the_address() -> None:
    with pytest.raises(ConnectionLost, match=r"127\.0\.0\.1:1 "):
        async with Client("127.0.0.1:1", connect_timeout=2):
            pass


async def test_first_reachable_address_is_used(url: str) -> None:
    async with Client(f"127.0.0.1:1,{url}", connect_timeout=2) as client:
        assert client.target == url
        await client.queues()


def test_sync_client(url: str) -> None:
    q = unique()
    with SyncClient(url) as client:
        ids = [client.send(q, f"m{i}", group_id="g") for i in range(5)]
        assert ids == sorted(ids)
        assert {x.name: x.depth for x in client.queues()}[q] == 5
        [group] = client.groups(q)
        assert (group.group, group.pending) == ("g", 5)
        got = client.consume(q, 3)
        assert [(m.text, m.group_seq) for m in got] == [("m0", 1), ("m1", 2), ("m2", 3)]
        assert [m.text for m in client.consume(q, 10, timeout=0.5)] == ["m3", "m4"]
        assert client.consume(q, 1, timeout=0.2) == []


async def test_a_receive_cancelled_as_its_wait_ends_is_cancelled(url: str) -> None:
    """The cancel must win: Python 3.11's `asyncio.wait_for` dropped a cancel that came as the
    awaited event was set, and a consumer loop cancelled that way never ended (a drill's
    clean-up hung on it)."""
    queue = unique()
    async with Client(url) as client:
        await client.create_queue(queue)
        async with client.consumer(queue) as consumer:
            receiving = asyncio.create_task(consumer.receive(timeout=30))
            await asyncio.sleep(0.2)
            consumer._arrived.set()  # what a delivery does
            await asyncio.sleep(0)  # the wait wakes up
            receiving.cancel()
            with pytest.raises(asyncio.CancelledError):
                async with asyncio.timeout(5):
                    await receiving
