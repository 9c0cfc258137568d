"""What a start costs with a big SQLite store: opening it by its index against reading every
message whole, on the same store in the same run.

A store of `--messages` persistent grouped messages of 100 bytes (`--groups` groups) is
written once; then, `--rounds` times each, alternating: `Engine.open` (the index: grouped
messages come back paged, broker/restoring.py) and the whole read it replaced
(`restore_messages` over every stored message, in a fresh core). The node's own collector
thresholds apply (pinmq/process.py). Prints each time and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from broker.config import NodeConfig, QueueConfig
from broker.core import BrokerCore
from broker.engine import Engine
from broker.store import Store
from broker.store_writes import MessageWrite
from pinmq.process import GC_THRESHOLDS

QUEUE = "orders"
CHUNK = 10_000


async def _fill(config: NodeConfig, messages: int, groups: int) -> None:
    engine = Engine(config)
    engine.open()
    await engine.create_queue(QUEUE, QUEUE, QueueConfig())
    await engine.close()
    store = Store.open(Path(config.node.data_dir) / "store.db")
    body, now = b"x" * 100, time.time_ns()
    for start in range(1, messages + 1, CHUNK):
        rows = []
        for i in range(start, min(messages + 1, start + CHUNK)):
            group = f"g{i % groups}"
            headers = json.dumps({"JMSXGroupID": group})
            rows.append((i, QUEUE, QUEUE, headers, 0, group, 0, now, body))
        await store.apply(MessageWrite(added=rows))
    await store.close()


async def _by_index(config: NodeConfig) -> tuple[float, int]:
    """Seconds to open, and the depth of the queue then (paged messages included)."""
    engine = Engine(config)
    started = time.perf_counter()
    engine.open()
    took = time.perf_counter() - started
    depth = engine.queue(QUEUE).depth
    await engine.close()
    return took, depth


async def _whole(config: NodeConfig) -> tuple[float, int]:
    store = Store.open(Path(config.node.data_dir) / "store.db")
    core = BrokerCore(config)
    started = time.perf_counter()
    for address, name, settings in store.load_queues():
        core.restore_queue(address, name, QueueConfig.model_validate(settings))
    core.restore_messages(store.messages(), store.max_msg_id() + 1)
    took = time.perf_counter() - started
    await store.close()
    return took, core.queue(QUEUE).depth


async def main() -> bool:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    gc.set_threshold(*GC_THRESHOLDS)
    with tempfile.TemporaryDirectory(prefix="pinmq-bench-restore-") as tmp:
        config = NodeConfig.model_validate(
            {"node": {"id": "bench", "data-dir": tmp}, "store": {"format": "sqlite"}}
        )
        print(f"writing {args.messages} messages in {args.groups} groups...", flush=True)
        await _fill(config, args.messages, args.groups)
        index: list[float] = []
        whole: list[float] = []
        depths: set[int] = set()
        for r in range(args.rounds):
            for times, run in ((index, _by_index), (whole, _whole)):
                took, depth = await run(config)
                times.append(took)
                depths.add(depth)
                gc.collect()
            print(f"round {r + 1}: by index {index[-1]:.2f} s, whole {whole[-1]:.2f} s", flush=True)
    a, b = statistics.median(index), statistics.median(whole)
    print(f"open, median of {args.rounds}: by index {a:.2f} s, whole {b:.2f} s, ratio {a / b:.2f}")
    verdict = "PASS" if depths == {args.messages} else "FAIL"
    print(f"every message restored both ways (depths {sorted(depths)}): {verdict}")
    return verdict == "PASS"


if __name__ == "__main__":
    sys.exit(0 if asyncio.run(main()) else 1)
