"""Memory per tracked idle group: 1M groups pinned to consumers, no pending messages.

Builds one `Queue` with 3 consumers, sends one message to each of N groups (ids like
`group-0000001`, created inside the measured region so their strings count) and acks it,
which leaves every group pinned and idle. Reports bytes per group two ways: tracemalloc
(Python allocations still alive, in a fresh interpreter state) and the RSS delta of the
process (measured in a separate run, without tracemalloc). Target: <= 300 B per group.
Usage: python bench/group_memory.py [--quick] [--groups N]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from pathlib import Path

from broker.config import QueueConfig
from broker.effects import Effects
from broker.group_state import Group
from broker.message import GROUP_ID_HEADER, Message
from broker.queue import Queue

TARGET = 300
CLOCK0 = 1_780_000_000_000_000_000  # wall-clock ns (the node passes time.time_ns())


def rss_bytes() -> int:
    """Current resident set size, from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def pin_groups(n: int) -> Queue:
    """A queue whose n groups are each pinned to one of 3 consumers, with nothing pending."""
    q = Queue("mem", "mem", QueueConfig())
    for c in ("c1", "c2", "c3"):
        q.subscribe(c, c, 100, 0, Effects())
    for i in range(n):
        fx = Effects()
        now = CLOCK0 + i * 1000
        q.enqueue(Message(i + 1, "mem", "mem", b"", {GROUP_ID_HEADER: f"group-{i:07d}"}), now, fx)
        (d,) = fx.deliveries
        q.ack(d.consumer_id, (d.delivery_id,), now, Effects())
    return q


def check(q: Queue, n: int) -> None:
    infos = q.groups()
    assert len(infos) == n, "every group is tracked"
    assert all(g.owner and not g.pending and not g.outstanding for g in infos), "all idle"
    del infos


def measure_traced(n: int) -> tuple[int, Queue]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    q = pin_groups(n)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before, q


def measure_rss(n: int) -> tuple[int, Queue]:
    gc.collect()
    before = rss_bytes()
    q = pin_groups(n)
    gc.collect()
    return rss_bytes() - before, q


def breakdown(q: Queue) -> list[tuple[str, float]]:
    """Estimated bytes per group by structure (sys.getsizeof, before allocator rounding)."""
    n = len(q._groups)
    g = next(iter(q._groups.values()))
    sets = sum(sys.getsizeof(c.groups) for c in q._consumers.values())
    return [
        ("Group object", sys.getsizeof(g)),
        ("group id str", sys.getsizeof(g.key)),
        ("last_use_ns int", sys.getsizeof(g.last_use_ns)),
        ("Queue._groups dict", sys.getsizeof(q._groups) / n),
        ("consumer.groups sets", sets / n),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k groups instead of 1M")
    parser.add_argument("--groups", type=int, default=None, help="number of groups")
    args = parser.parse_args()
    n = args.groups or (100_000 if args.quick else 1_000_000)

    rss, q = measure_rss(n)  # first, in a clean heap, without tracemalloc overhead
    check(q, n)
    del q
    gc.collect()
    traced, q = measure_traced(n)
    check(q, n)

    print(f"{n:,} idle pinned groups, 3 consumers, ids like 'group-0000001'")
    print(f"  tracemalloc: {traced / n:7.1f} B/group  ({traced / 2**20:.1f} MiB total)")
    print(f"  RSS delta:   {rss / n:7.1f} B/group  ({rss / 2**20:.1f} MiB total)")
    print(f"  target:      {TARGET:7d} B/group  -> {'OK' if traced / n <= TARGET else 'OVER'}")
    print("  breakdown (sys.getsizeof, containers amortised over groups):")
    parts = breakdown(q)
    for name, size in parts:
        print(f"    {name:<22} {size:6.1f} B")
    print(f"    {'sum':<22} {sum(size for _, size in parts):6.1f} B (rest: allocator rounding)")
    print(f"  Group has {len(Group.__slots__)} slots: {', '.join(Group.__slots__)}")


if __name__ == "__main__":
    main()
