"""Core dispatch cost per message (send -> deliver -> ack) at 10, 10k and 1M pinned groups.

Steady state: one `Queue`, 3 consumers with prefetch 100, every one of the N groups already
pinned to a consumer (so the group table really holds N groups). The timed loop sends
messages spread over all groups (a fixed pseudo-random permutation), each one is delivered
at once, and deliveries are acked once 150 are in flight (half the total credit), so the
consumers always hold some unacked messages. Effects are created per operation, as the
broker core does. Each size runs `--repeats` times and the run with the lowest mean is
reported (the machine is shared: the slower runs measure the neighbours, not the core).
Usage: python bench/core_dispatch.py [--quick] [--messages M] [--repeats R]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import time
from array import array
from collections import deque

from broker.config import QueueConfig
from broker.effects import Effects
from broker.message import GROUP_ID_HEADER, Message
from broker.queue import Queue

CONSUMERS = ("c1", "c2", "c3")
PREFETCH = 100
IN_FLIGHT = 150


def build(groups: int) -> tuple[Queue, list[dict[str, str]]]:
    """A queue with `groups` idle groups pinned (round-robin-ish) over the three consumers."""
    q = Queue("bench", "bench", QueueConfig())
    for c in CONSUMERS:
        q.subscribe(c, c, PREFETCH, 0, Effects())
    headers = [{GROUP_ID_HEADER: f"group-{i:07d}"} for i in range(groups)]
    for i, h in enumerate(headers):
        fx = Effects()
        q.enqueue(Message(i + 1, "bench", "bench", b"", h), 0, fx)
        (d,) = fx.deliveries
        q.ack(d.consumer_id, (d.delivery_id,), 0, Effects())
    assert len(q.groups()) == groups and q.depth == 0
    return q, headers


def run(q: Queue, headers: list[dict[str, str]], messages: int, seed: int) -> array:
    """Times `messages` send/deliver/ack cycles; returns per-message ns."""
    rng = random.Random(seed)
    picks = [headers[rng.randrange(len(headers))] for _ in range(messages)]
    first_id = 10_000_000
    batch = [Message(first_id + i, "bench", "bench", b"", h) for i, h in enumerate(picks)]
    window: deque[tuple[str, int]] = deque()
    samples = array("q", bytes(8 * messages))
    enqueue, ack, clock = q.enqueue, q.ack, time.perf_counter_ns
    gc.collect()
    for i, m in enumerate(batch):
        t0 = clock()
        fx = Effects()
        enqueue(m, i, fx)
        for d in fx.deliveries:
            window.append((d.consumer_id, d.delivery_id))
        while len(window) > IN_FLIGHT:
            cid, did = window.popleft()
            ack(cid, (did,), i, Effects())
        samples[i] = clock() - t0
    while window:  # settle the tail (not timed)
        cid, did = window.popleft()
        ack(cid, (did,), 0, Effects())
    assert q.depth == 0, "every message was delivered and acked"
    return samples


def print_load() -> None:
    """The machine is shared: the load average says how much the figures can be trusted."""
    one, five, fifteen = os.getloadavg()
    print(f"load average (1/5/15 min): {one:.2f} {five:.2f} {fifteen:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--messages", type=int, default=None, help="messages per size")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per size (best kept)")
    args = parser.parse_args()
    print_load()
    sizes = [10, 1_000, 10_000] if args.quick else [10, 10_000, 1_000_000]
    messages = args.messages or (20_000 if args.quick else 200_000)
    print(
        f"send -> deliver -> ack, {messages:,} messages x {args.repeats} runs (best kept), "
        f"3 consumers x prefetch {PREFETCH}, {IN_FLIGHT} in flight"
    )
    print(
        f"{'groups':>10} {'setup s':>8} {'mean us':>8} {'p50 us':>7} {'p99 us':>7} "
        f"{'msg/s':>8} {'ratio':>6} {'p50 ratio':>9}"
    )
    baseline = base_p50 = None
    for n in sizes:
        t0 = time.perf_counter()
        q, headers = build(n)
        setup = time.perf_counter() - t0
        runs = [run(q, headers, messages, seed=n + r) for r in range(args.repeats)]
        samples = min(runs, key=sum)
        mean = sum(samples) / len(samples) / 1000
        cuts = statistics.quantiles(samples, n=100)
        p50, p99 = cuts[49] / 1000, cuts[98] / 1000
        baseline, base_p50 = baseline or mean, base_p50 or p50
        print(
            f"{n:>10,} {setup:>8.1f} {mean:>8.2f} {p50:>7.2f} {p99:>7.2f} "
            f"{1e6 / mean:>8,.0f} {mean / baseline:>6.2f} {p50 / base_p50:>9.2f}"
        )
        del q, headers, samples, runs
        gc.collect()
    print_load()


if __name__ == "__main__":
    main()
