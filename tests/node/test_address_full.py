"""address-full-policy on a real node: FAIL refuses past max-size-bytes, BLOCK holds producers
until consumers make room, PAGE keeps the backlog on disk and memory within the budget, and
every message still reaches its group's consumer in order, across a restart too."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import PINMQ, NodeProcess, depth, get
from stomp_helpers import Raw

from broker.client import Client, Full
from broker.message import GROUP_ID_HEADER, GROUP_SEQ_HEADER
from pinmq.stomp.frames import encode_frame

BUDGET = 32 * 1024
PAGE_BUDGET = 64 * 1024


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    settings = {
        "#": {},
        "fail.#": {"max-size-bytes": BUDGET, "address-full-policy": "FAIL"},
        "block.#": {"max-size-bytes": BUDGET, "address-full-policy": "BLOCK"},
        "page.#": {"max-size-bytes": PAGE_BUDGET},  # PAGE: the default
    }
    node = NodeProcess(tmp_path, {"address-settings": settings}).start()
    yield node
    node.kill()


def resources(node: NodeProcess) -> dict[str, Any]:
    return get(node.http, "/readyz")[1]["resources"]


async def drain(client: Client, queue: str, count: int) -> dict[str, list[int]]:
    """Receive and ack `count` messages; the JMSXGroupSeq values per group, as received.
    No more came before the receipt of the last ack (the node sends deliveries first)."""
    seen: dict[str, list[int]] = defaultdict(list)
    async with client.consumer(queue, prefetch=50) as consumer:
        for i in range(count):
            m = await consumer.receive(timeout=30)
            assert m is not None, f"only {sum(map(len, seen.values()))} of {count} arrived"
            assert m.group_id is not None
            seen[m.group_id].append(m.group_seq)
            await m.ack(wait=i == count - 1)
        assert await consumer.receive(0) is None
    return seen


async def test_fail_refuses_past_max_size_bytes_and_takes_sends_again_once_drained(
    node: NodeProcess,
) -> None:
    queue = f"fail.{uuid.uuid4().hex[:8]}"
    async with Client(node.url) as client:
        await client.create_queue(queue)
        producer = client.producer(queue, group_id="g")
        sent = 0
        with pytest.raises(Full, match=r"max-size-bytes \(32768\).*address-full-policy FAIL"):
            for _ in range(100):
                await producer.send(b"x" * 1024)
                sent += 1
        assert 10 < sent < BUDGET // 1024  # each counts for its body, headers and overhead
        with Raw(node.stomp_port) as raw:
            raw.connect()
            frame = {"destination": f"/queue/{queue}", "receipt": "r1"}
            raw.send(encode_frame("SEND", frame, b"y", version="1.2"))
            error = raw.frame()
            assert error.command == "ERROR" and "max-size-bytes" in error.headers["message"]
        assert (await client.queues())[0].depth == sent  # nothing refused got in
        seen = await drain(client, queue, sent)
        assert seen["g"] == sorted(seen["g"]) and len(seen["g"]) == sent
        assert await depth(client, queue) == 0
        await producer.send(b"room again")


async def test_block_holds_producers_until_consumers_make_room(node: NodeProcess) -> None:
    queue = f"block.{uuid.uuid4().hex[:8]}"
    notices: list[str] = []
    async with Client(node.url, on_blocked=notices.append) as client:
        await client.create_queue(queue)
        producers = [client.producer(queue, group_id=f"g{i}") for i in range(4)]

        async def produce(p: Any) -> None:
            for _ in range(50):
                await p.send(b"z" * 1024)

        sending = asyncio.gather(*(produce(p) for p in producers))
        for _ in range(200):
            if notices and resources(node)["blocked_producers"] == 4:
                break
            await asyncio.sleep(0.05)
        assert notices and "BLOCK" in notices[0]
        assert resources(node)["blocked_producers"] == 4  # each waits, none failed
        assert not sending.done()
        # A STOMP SEND waits too (its RECEIPT with it), and `pinmq send` says it is blocked.
        raw = Raw(node.stomp_port)
        raw.connect()
        frame = {"destination": f"/queue/{queue}", "receipt": "held", GROUP_ID_HEADER: "stomp"}
        raw.send(encode_frame("SEND", frame, b"s", version="1.2"))
        command = [*PINMQ, "send", queue, "--group", "cli", "--body", "c", "--url", node.url]
        cli = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            for _ in range(200):
                if resources(node)["blocked_producers"] == 6:
                    break
                await asyncio.sleep(0.05)
            assert resources(node)["blocked_producers"] == 6
            assert (await client.queues())[0].depth < BUDGET // 1024
            seen = await drain(client, queue, 202)
            assert await depth(client, queue) == 0
            await sending
            assert raw.frame().headers.get("receipt-id") == "held"
            out, err = cli.communicate(timeout=30)
            assert cli.returncode == 0 and "sent 1 messages" in out, err
            assert "send blocked by" in err and "address-full-policy BLOCK" in err
        finally:
            raw.close()
            cli.kill()
            cli.wait()
    assert sorted(seen) == ["cli", "g0", "g1", "g2", "g3", "stomp"]
    for group in ("g0", "g1", "g2", "g3"):
        assert seen[group] == list(range(1, 51))
    assert resources(node)["blocked_producers"] == 0


async def test_page_keeps_memory_within_the_budget_and_delivers_every_group_in_order(
    node: NodeProcess,
) -> None:
    queue = f"page.{uuid.uuid4().hex[:8]}"
    groups, per_group = 30, 100
    items = [
        (b"p" * 1024, {GROUP_ID_HEADER: f"g{i % groups}", GROUP_SEQ_HEADER: str(i // groups + 1)})
        for i in range(groups * per_group)
    ]
    total = len(items)
    async with Client(node.url) as client:
        await client.create_queue(queue)
        await client.producer(queue).send_many(items, batch_size=100)
        held = resources(node)
        assert held["paging_queues"] == [queue]
        assert held["paged_messages"] > total - PAGE_BUDGET // 1024
        assert held["memory_bytes"] <= PAGE_BUDGET + 2048  # one message past the budget at most
        assert (await client.queues())[0].depth == total
    assert node.stop() == 0
    node.start()  # restored paged: memory stays within the budget
    held = resources(node)
    assert held["paged_messages"] > total - PAGE_BUDGET // 1024
    assert held["memory_bytes"] <= PAGE_BUDGET + 2048
    async with Client(node.url) as client:
        seen = await drain(client, queue, total)
        assert (await client.queues())[0].depth == 0
    assert len(seen) == groups
    for seqs in seen.values():
        assert seqs == list(range(1, per_group + 1))
    assert resources(node)["paging_queues"] == []


async def test_stomp_transactions_and_partial_frames_count_against_global_max_size(
    tmp_path: Path,
) -> None:
    """What a STOMP connection buffers (open transactions, a partial frame) is memory too:
    it fills the node's budget, and a partial frame stops being read while the node is full."""
    budget = 512 * 1024
    node = NodeProcess(
        tmp_path,
        {
            "limits": {"global-max-size": budget, "max-message-size": 4 << 20},
            "stomp": {"max-frame-size": 8 << 20, "frame-timeout-ms": 2000},
            "address-settings": {"#": {"address-full-policy": "FAIL"}},
        },
    ).start()
    try:
        async with Client(node.url) as client:
            await client.create_queue("tx")
            producer = client.producer("tx")
            with Raw(node.stomp_port) as raw:
                raw.connect()
                raw.send(encode_frame("BEGIN", {"transaction": "t1"}, b"", version="1.2"))
                for n in range(9):  # 540 KiB: each is admitted while the node holds less
                    frame = {"destination": "/queue/tx", "transaction": "t1", "receipt": f"r{n}"}
                    raw.send(encode_frame("SEND", frame, b"t" * 60 * 1024, version="1.2"))
                    assert raw.frame().command == "RECEIPT"
                assert resources(node)["memory_bytes"] >= 540 * 1024
                with pytest.raises(Full, match=r"limits.global-max-size \(524288\)"):
                    await producer.send(b"x")
                abort = {"transaction": "t1", "receipt": "r3"}
                raw.send(encode_frame("ABORT", abort, b"", version="1.2"))
                assert raw.frame().command == "RECEIPT"
                assert resources(node)["memory_bytes"] < 1024
                await producer.send(b"room again")

            # The node sees this close only once the paused read's frame deadline passes.
            with Raw(node.stomp_port) as partial:
                partial.connect()
                head = b"SEND\ndestination:/queue/tx\ncontent-length:3145728\n\n"
                partial.sock.settimeout(2)
                with contextlib.suppress(TimeoutError):  # the node stops reading: sends block
                    partial.send(head + b"p" * (2 << 20))
                for _ in range(100):
                    held = resources(node)
                    if held["blocked_producers"]:
                        break
                    await asyncio.sleep(0.05)
                assert held["blocked_producers"] == 1  # its reader waits for room
                assert budget < held["memory_bytes"] <= budget + 256 * 1024 + 4096
                with pytest.raises(Full):
                    await producer.send(b"x")
            for _ in range(100):
                if resources(node)["memory_bytes"] < budget:
                    break
                await asyncio.sleep(0.05)
            await producer.send(b"after the partial frame went")
    finally:
        node.kill()


async def test_deleting_a_paging_queue_removes_its_paged_messages_too(node: NodeProcess) -> None:
    queue = f"page.{uuid.uuid4().hex[:8]}"
    async with Client(node.url) as client:
        await client.create_queue(queue)
        await client.producer(queue).send_many([b"d" * 1024] * 300, batch_size=100)
        assert resources(node)["paged_messages"] > 200
        assert await client.delete_queue(queue) == 300  # in memory and paged alike
        assert resources(node)["paging_queues"] == []
        assert resources(node)["memory_bytes"] == 0
    assert node.stop() == 0
    node.start()
    async with Client(node.url) as client:
        assert queue not in {q.name for q in await client.queues()}


async def test_a_stuck_consumer_does_not_hold_back_other_groups_paged_messages(
    node: NodeProcess,
) -> None:
    """One consumer takes a group and never acks; its backlog fills the address's budget and
    the rest pages. Another group, paged behind it, still reaches a second consumer in full
    and in order: memory goes to the groups that can move."""
    queue = f"page.{uuid.uuid4().hex[:8]}"
    async with Client(node.url) as client:
        await client.create_queue(queue)
        stuck = client.consumer(queue, name="stuck", prefetch=1)
        await stuck.start()
        items = [
            (b"s" * 1024, {GROUP_ID_HEADER: "stuck", GROUP_SEQ_HEADER: str(i + 1)})
            for i in range(150)
        ]
        items += [
            (b"f" * 1024, {GROUP_ID_HEADER: "free", GROUP_SEQ_HEADER: str(i + 1)})
            for i in range(100)
        ]
        await client.producer(queue).send_many(items, batch_size=50)
        first = await stuck.receive(timeout=10)
        assert first is not None and first.group_id == "stuck"  # and never acked
        assert resources(node)["paged_messages"] > 100
        seen = await drain(client, queue, 100)
        assert seen == {"free": list(range(1, 101))}
        assert await depth(client, queue) == 150  # the stuck group's, one of them out
        assert resources(node)["memory_bytes"] <= PAGE_BUDGET + 2048 * 10
        await stuck.close()
