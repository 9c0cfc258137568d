"""The failover-gap drill that bench/ha.py (processes) and bench/containers.py (containers) run.

A grouped producer sends one persistent message every 10 ms through an address list while a
consumer reads them through the same list; after a second of steady flow the caller's `kill`
runs (kill -9 of a process, `docker kill` of a container). The drill notes the wall-clock
moment the kill returned, the first send confirmed after it and the first message sent after
it that the consumer received, then lets the consumer drain and checks that every confirmed
message arrived.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from broker.client import Client

PACE_S = 0.01


@dataclass
class Gap:
    """One drill: wall-clock moments (s) and what was confirmed and received."""

    killed_at: float = 0.0
    first_send: float | None = None  # the first send confirmed after the kill
    first_seen: float | None = None  # the first message sent after it, at the consumer
    confirmed: set[int] = field(default_factory=set)
    received: Counter[int] = field(default_factory=Counter)
    error: str = ""

    @property
    def lost(self) -> int:
        return len(self.confirmed - self.received.keys())


async def gap_drill(
    url: str, queue: str, kill: Callable[[], Awaitable[None]], wait_s: float, drain_s: float
) -> Gap:
    """Run the drill; `error` says what went wrong (no send or delivery after the kill within
    `wait_s`, a client that failed, confirmed messages not received within `drain_s`)."""
    gap = Gap()
    producing, consuming = asyncio.Event(), asyncio.Event()
    killed = False

    async def produce() -> None:
        async with Client(url) as client:
            producer = client.producer(queue, group_id="g")
            i = 0
            while not producing.is_set():
                after = killed
                await producer.send(f"{i}:{int(after)}")
                gap.confirmed.add(i)
                if after and gap.first_send is None:
                    gap.first_send = time.time()
                i += 1
                await asyncio.sleep(PACE_S)

    async def consume() -> None:
        async with Client(url) as client, client.consumer(queue) as consumer:
            while not consuming.is_set():
                msg = await consumer.receive(timeout=0.5)
                if msg is None:
                    continue
                await msg.ack()
                i, after = msg.text.split(":")
                gap.received[int(i)] += 1
                if after == "1" and gap.first_seen is None:
                    gap.first_seen = time.time()

    tasks = [asyncio.create_task(produce()), asyncio.create_task(consume())]
    await asyncio.sleep(1.0)  # steady flow first
    await kill()
    gap.killed_at, killed = time.time(), True
    deadline = time.monotonic() + wait_s
    while gap.first_send is None or gap.first_seen is None:
        if time.monotonic() > deadline or any(t.done() for t in tasks):
            break
        await asyncio.sleep(0.01)
    producing.set()
    deadline = time.monotonic() + drain_s
    while gap.lost and time.monotonic() < deadline and not tasks[1].done():
        await asyncio.sleep(0.05)
    consuming.set()
    errors = [e for e in await asyncio.gather(*tasks, return_exceptions=True) if e is not None]
    if errors:
        gap.error = "; ".join(f"{type(e).__name__}: {e}" for e in errors)
    elif gap.first_send is None or gap.first_seen is None:
        gap.error = f"no send or delivery through the backup within {wait_s:g} s of the kill"
    elif gap.lost:
        gap.error = f"{gap.lost} confirmed messages never received"
    return gap
