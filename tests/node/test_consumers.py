"""Consumers that hurt others, on a real node: one that stalls gets no new group (and is named
by `pinmq groups` and the log), and no consumer gets more prefetch than `limits.max-prefetch`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import NodeProcess, cli, unique
from waiting import until

from broker.client import Client, ConsumerInfo

SETTINGS = {"#": {"default-slow-consumer-threshold": 300}}
GUARD_S = 20.0


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    extra = {"address-settings": SETTINGS, "limits": {"max-prefetch": 5}}
    node = NodeProcess(tmp_path, extra).start()
    yield node
    node.kill()


async def until_consumer(
    client: Client, queue: str, name: str, check: Callable[[ConsumerInfo], bool]
) -> ConsumerInfo:
    """The consumer named so (any: "") as the node reports it, once `check` holds."""

    async def found() -> ConsumerInfo | None:
        infos = await client.consumers(queue)
        return next((i for i in infos if name in ("", i.name) and check(i)), None)

    return await until(f"consumer {name or '(any)'} of {queue} as expected", found, GUARD_S)


async def test_a_stalled_consumer_gets_no_new_group_and_is_reported(node: NodeProcess) -> None:
    queue = unique("slow")
    async with Client(node.url) as client:
        stuck = client.consumer(queue, name="stuck", prefetch=1000)
        busy = client.consumer(queue, name="busy", prefetch=1000)
        await client.create_queue(queue)
        await stuck.start()
        first = client.producer(queue, group_id="g0")
        await first.send(b"held forever")  # to `stuck`, the first consumer: never acked
        m = await stuck.receive(timeout=5)
        assert m is not None and m.group_id == "g0"
        await until_consumer(client, queue, "stuck", lambda c: c.stalled_ms > 0)  # the node's view
        await busy.start()
        for g in range(1, 6):  # `busy` has more groups each time, yet gets every new one
            await client.producer(queue, group_id=f"g{g}").send(b"x")
            got = await busy.receive(timeout=5)
            assert got is not None and got.group_id == f"g{g}"
            await got.ack(wait=True)
        consumers = {c.name: c for c in await client.consumers(queue)}
        assert consumers["stuck"].stalled_ms >= 300 and consumers["stuck"].unacked == 1
        assert consumers["busy"].stalled_ms == 0 and consumers["busy"].groups == 5
        # The prefetch asked for (1000) is cut to limits.max-prefetch.
        assert {c.prefetch for c in consumers.values()} == {5}
        listing = await asyncio.to_thread(cli, "groups", queue, "--url", node.url)
        assert listing.returncode == 0, listing.stderr
        assert "gets no new group" in listing.stdout and "stuck" in listing.stdout
        await stuck.close()
        await busy.close()
    lines = [json.loads(line) for line in node.log_path.read_text().splitlines() if "{" in line]
    [warning] = [e for e in lines if e.get("event", "").startswith("consumer stalls")]
    assert warning["consumer"] == "stuck" and warning["queue"] == queue


async def test_a_consumer_never_holds_more_than_max_prefetch(node: NodeProcess) -> None:
    queue = unique("cap")
    async with Client(node.url) as client:
        await client.create_queue(queue)
        await client.producer(queue).send_batch([b"m"] * 50)
        consumer = client.consumer(queue, prefetch=2**31 - 1)
        await consumer.start()
        # One dispatch fills the consumer's credit; no more comes without a settle.
        info = await until_consumer(client, queue, "", lambda c: c.unacked > 0)
        assert info.prefetch == 5 and info.unacked == 5
        await consumer.close()
