"""What a `/metrics` scrape costs as a queue's groups grow: time and size, against 10 groups.

Builds, in this process, one `Queue` per size with N groups: 3 consumers with prefetch 100
own a first share of the groups, then every other group waits unowned with one message, and
one group in five has a backlog past the top-K threshold. The scrape is the node's own
collector (`pinmq/metrics.py` over `pinmq/queue_metrics.py`) rendered in the Prometheus text
format by prometheus-client, as `GET /metrics` does. Prints, per size, the median scrape time
over `--scrapes` scrapes, the bytes of the text, and both as ratios to the 10-group baseline
measured in the same run. Target: a scrape bounded by metrics.top-groups, not by the groups
(a ratio near 1 at a million groups).

Usage: python bench/metrics.py [--quick] [--groups N ...] [--scrapes S] [--top K]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

from prometheus_client.exposition import generate_latest

from broker.config import QueueConfig
from broker.effects import Effects
from broker.message import GROUP_ID_HEADER, Message
from broker.queue import Queue
from pinmq.metrics import NodeCollector

CLOCK0 = 1_780_000_000_000_000_000  # wall-clock ns (the node passes time.time_ns())
BASELINE = 10


class _Engine:
    """The one part of the engine the collector reads per queue, for a bare queue."""

    store_open = False  # no store, no audit log: the queue part is what grows with the groups
    audit = None

    def __init__(self, queue: Queue) -> None:
        self._queue = queue

    def queues(self) -> list[Queue]:
        return [self._queue]

    def resources(self) -> dict[str, int]:
        return dict.fromkeys(
            ("memory_bytes", "global_max_size", "disk_percent", "max_disk_usage"), 1
        ) | {"blocked_producers": 0, "duplicates_dropped": 0}


def build(groups: int) -> Queue:
    """A queue of `groups` groups: 300 owned and out, the rest waiting, some deep."""
    q = Queue("bench", "bench", QueueConfig())
    for c in ("c1", "c2", "c3"):
        q.subscribe(c, c, 100, CLOCK0, Effects())
    msg_id = 0
    for i in range(groups):
        for _ in range(9 if i % 5 == 0 else 1):
            msg_id += 1
            headers = {GROUP_ID_HEADER: f"group-{i:07d}"}
            m = Message(msg_id, "bench", "bench", b"x", headers, enqueued_ns=CLOCK0 + msg_id)
            q.enqueue(m, CLOCK0 + msg_id, Effects())
    return q


def scrape(collector: NodeCollector, times: int) -> tuple[float, int]:
    """Median seconds of one scrape, and the bytes it renders."""
    registry = collector.registry()
    took, size = [], 0
    for _ in range(times):
        start = time.perf_counter()
        size = len(generate_latest(registry))
        took.append(time.perf_counter() - start)
    return statistics.median(took), size


def measure(sizes: Sequence[int], scrapes: int, top: int) -> None:
    rows = []
    for groups in (BASELINE, *sizes):
        start = time.perf_counter()
        q = build(groups)
        built = time.perf_counter() - start
        collector = NodeCollector(
            "bench",
            _Engine(q),
            top_groups=top,
            clock=lambda: CLOCK0 + 10**10,  # type: ignore[arg-type]
        )
        seconds, size = scrape(collector, scrapes)
        counts = q.counts()
        rows.append((groups, counts.owned, counts.unowned_waiting, built, seconds, size))
        print(f"  {groups:>9,} groups built in {built:.1f} s", flush=True)
    base_s, base_size = rows[0][4], rows[0][5]
    print(f"\nScrape of one queue, top-groups {top}, median of {scrapes}, x base: to {BASELINE}")
    head = ("groups", "owned", "waiting", "scrape ms", "x base", "bytes", "x base")
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, (10, 7, 9, 10, 7, 8, 7), strict=True)))
    for groups, owned, waiting, _, seconds, size in rows:
        print(
            f"{groups:>10,} {owned:>7,} {waiting:>9,} {seconds * 1000:>10.2f}"
            f" {seconds / base_s:>7.2f} {size:>8,} {size / base_size:>7.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="up to 100,000 groups")
    parser.add_argument("--groups", type=int, nargs="+", metavar="N")
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--top", type=int, default=20, help="metrics.top-groups")
    args = parser.parse_args()
    sizes = args.groups or ([1_000, 100_000] if args.quick else [1_000, 100_000, 1_000_000])
    measure(sizes, args.scrapes, args.top)


if __name__ == "__main__":
    main()
