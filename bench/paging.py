"""address-full-policy PAGE with a backlog far larger than the memory budget.

One `pinmq node` (bench/harness). Persistent 1 KiB messages in `--groups` groups go to
queue `paged.q`, whose address may hold `--budget` MiB in memory (PAGE), with no consumer;
the node's RSS is printed at each `--checkpoints` backlog size. Then the drain rate of the
paged backlog is compared with the in-memory rate in the same run: `--drain` messages sent
to `mem.q` (an address without a budget) are drained first, then as many from `paged.q`,
by the same consumer (prefetch 1000, acks in batches). Targets (issue 14): RSS under 2 GiB
at 10M messages; the paged drain at >= 50% of the in-memory one.

Usage: python bench/paging.py [--checkpoints 1000000,5000000,10000000] [--groups 100000]
           [--budget MIB] [--drain N]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from harness.nodes import running_node
from harness.procs import rss_mib, run_main

from broker.client import Client
from broker.message import GROUP_ID_HEADER

BODY = b"m" * 1024


def items(start: int, count: int, groups: int) -> Iterator[tuple[bytes, dict[str, str]]]:
    for i in range(start, start + count):
        yield BODY, {GROUP_ID_HEADER: f"group-{i % groups:06d}"}


async def drain(client: Client, queue: str, count: int) -> float:
    """Receive and ack `count` messages; messages per second."""
    started = time.perf_counter()
    got = 0
    async with client.consumer(queue, prefetch=1000) as consumer:
        batch = []
        while got < count:
            m = await consumer.receive(timeout=60)
            if m is None:
                raise RuntimeError(f"{queue}: only {got} of {count} arrived")
            batch.append(m)
            got += 1
            if len(batch) >= 500:
                await consumer.ack_many(batch)
                batch = []
        await consumer.ack_many(batch, wait=True)
    return count / (time.perf_counter() - started)


async def run(url: str, pid: int, args: argparse.Namespace) -> None:
    checkpoints = sorted(int(c) for c in args.checkpoints.split(","))
    async with Client(url, call_timeout=120) as client:
        await client.create_queue("paged.q")
        await client.create_queue("mem.q")
        producer = client.producer("paged.q")
        print(f"RSS at start: {rss_mib(pid):.0f} MiB; budget {args.budget} MiB, PAGE")
        print(f"{'backlog':>10} {'RSS MiB':>8} {'send msg/s':>11} {'bytes/msg':>10}")
        sent, base = 0, rss_mib(pid)
        for target in checkpoints:
            started = time.perf_counter()
            await producer.send_many(items(sent, target - sent, args.groups), batch_size=500)
            rate = (target - sent) / (time.perf_counter() - started)
            sent = target
            rss = rss_mib(pid)
            per = (rss - base) * (1 << 20) / sent
            print(f"{sent:10d} {rss:8.0f} {rate:11.0f} {per:10.1f}", flush=True)
        await client.producer("mem.q").send_many(items(0, args.drain, args.groups), batch_size=500)
        print(f"RSS with {args.drain} more in memory: {rss_mib(pid):.0f} MiB")
        in_memory = await drain(client, "mem.q", args.drain)
        paged = await drain(client, "paged.q", args.drain)
        print(
            f"drain in memory {in_memory:.0f} msg/s, paged {paged:.0f} msg/s, "
            f"ratio {paged / in_memory:.2f}"
        )
        print(f"RSS at end: {rss_mib(pid):.0f} MiB")


def main() -> bool:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoints", default="250000,500000,1000000")
    parser.add_argument("--groups", type=int, default=100_000)
    parser.add_argument("--budget", type=int, default=64, help="MiB paged.q may hold in memory")
    parser.add_argument("--drain", type=int, default=200_000)
    args = parser.parse_args()
    settings = {
        "#": {},
        "paged.#": {"max-size-bytes": args.budget << 20},
    }
    extra = {"address-settings": settings}
    with (
        tempfile.TemporaryDirectory(prefix="pinmq-paging-") as tmp,
        running_node(Path(tmp), extra) as node,
    ):
        asyncio.run(run(node.url, node.pid, args))
    return True


if __name__ == "__main__":
    run_main(main)
