"""What a client sees when its node freezes, stops, or comes back: real node processes.

A refusal, a request that was never sent and one whose outcome is unknown are three different
exceptions (`broker/client/errors.py`). No test asserts on timing: every wait is a bounded
guard, far longer than what it guards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from conftest import NodeProcess, drain, unique
from waiting import until

from broker.client import Client, ConnectionLost, OutcomeUnknown, Received, Unavailable

GUARD_S = 20.0


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    process = NodeProcess(tmp_path).start()
    try:
        yield process
    finally:
        if process.proc is not None and process.proc.poll() is None:
            os.kill(process.proc.pid, signal.SIGCONT)  # a stopped process ignores nothing else
        process.kill()


async def until_it_works(call: Callable[[], Awaitable[object]]) -> float:
    """Retry `call` while it fails with Unavailable; seconds until it worked (bounded)."""
    started = time.monotonic()

    async def works() -> bool:
        await call()
        return True

    await until("the call to work again", works, GUARD_S, every=0.05, ignoring=(Unavailable,))
    return time.monotonic() - started


async def drained(client: Client, queue: str) -> list[bytes]:
    """Every message left on `queue`, acked, in the order received."""
    return [m.body for m in await drain(client, queue)]


async def test_a_frozen_node_fails_a_send_as_outcome_unknown_instead_of_hanging(
    node: NodeProcess,
) -> None:
    queue = unique("frozen")
    async with Client(node.url) as client:
        await client.create_queue(queue)
        producer = client.producer(queue)
        with node.frozen():
            async with asyncio.timeout(GUARD_S):  # keepalive ends it within two intervals
                with pytest.raises(OutcomeUnknown, match="the outcome is unknown") as err:
                    await producer.send("sent into the freeze")
            assert err.value.code == "UNAVAILABLE"
        await until_it_works(lambda: producer.send("after the thaw"))
        bodies = await drained(client, queue)
    # The first send's outcome was unknown: here it was in fact enqueued before the freeze
    # bit, or not; either way nothing else is there and the later send arrived once.
    assert bodies[-1] == b"after the thaw" and bodies.count(b"after the thaw") == 1
    assert set(bodies) <= {b"sent into the freeze", b"after the thaw"}


async def test_a_call_past_its_deadline_is_outcome_unknown(node: NodeProcess) -> None:
    queue = unique("deadline")
    async with Client(node.url, call_timeout=0.5) as client:
        await client.create_queue(queue)
        with node.frozen():
            with pytest.raises(OutcomeUnknown, match="in time: the outcome is unknown") as err:
                await client.queues()
            assert err.value.code == "DEADLINE_EXCEEDED"
            with pytest.raises(OutcomeUnknown, match=r"within 0\.5 s"):
                await client.producer(queue).send_many(["a", "b"], batch_size=1)


@pytest.mark.slow
async def test_a_client_outlives_a_30_s_outage_and_is_told_nothing_was_sent_meanwhile(
    node: NodeProcess,
) -> None:
    queue = unique("outage")
    async with Client(node.url) as client:
        await client.create_queue(queue)
        producer = client.producer(queue)
        await producer.send("before")
        node.stop()

        async def refused_locally() -> bool:
            try:
                await producer.send("during")
            except ConnectionLost as err:
                assert "nothing was sent" in str(err)
                return True
            except OutcomeUnknown:
                return False  # the call that met the closing connection: retry
            raise AssertionError("a send to a stopped node succeeded")

        async with asyncio.timeout(GUARD_S):
            while not await refused_locally():
                await asyncio.sleep(0.05)
        await asyncio.sleep(30)
        node.start()
        took = await until_it_works(lambda: producer.send("after"))
        print(f"a send worked again {took:.2f} s after the node served again")
        bodies = await drained(client, queue)
    assert bodies == [b"before", b"after"]


async def test_acks_in_flight_at_a_clean_stop_are_confirmed_or_unknown_never_refused(
    node: NodeProcess,
) -> None:
    queue, n = unique("stopping"), 400
    async with Client(node.url) as client:
        await client.create_queue(queue)
        await client.producer(queue).send_batch([str(i) for i in range(n)])
        outcomes: dict[bytes, str] = {}

        async def ack(m: Received) -> None:
            try:
                await m.ack(wait=True)
                outcomes[m.body] = "acked"
            except OutcomeUnknown:
                outcomes[m.body] = "unknown"
            except ConnectionLost:
                outcomes[m.body] = "not sent"

        consumer = client.consumer(queue, prefetch=n)
        await consumer.start()
        tasks, stopping = [], None
        with contextlib.suppress(Unavailable):  # the stream ends with the node
            while len(tasks) < n and (m := await consumer.receive(timeout=5)) is not None:
                if len(tasks) < n // 4:
                    await ack(m)  # confirmed one by one before the stop
                tasks.append(asyncio.create_task(ack(m)) if len(tasks) >= n // 4 else None)
                if len(tasks) == n // 2:
                    stopping = asyncio.create_task(asyncio.to_thread(node.stop))
        assert stopping is not None
        await asyncio.gather(*(t for t in tasks if t), stopping)  # a refusal fails the test
    assert node.proc is not None and node.proc.returncode == 0
    node.start()
    async with Client(node.url) as client:
        back = set(await drained(client, queue))
    acked = {b for b, o in outcomes.items() if o == "acked"}
    assert len(acked) >= n // 4
    assert not acked & back, "an ack confirmed before the stop was not kept"
    assert {b for b, o in outcomes.items() if o == "not sent"} <= back
    # The node sent the receipt of every ack it took before it stopped: an ack left unknown
    # is one it never took, so its message is still there.
    assert {b for b, o in outcomes.items() if o == "unknown"} <= back
