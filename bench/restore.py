"""What a start costs with a big SQLite store: opening it by its index, or from the index an
ha backup keeps while following, against reading every message whole, on the same store in
the same run.

A store of `--messages` persistent grouped messages of 100 bytes (`--groups` groups) is
written once; then, `--rounds` times each, alternating: `Engine.open` scanning the store's
index (grouped messages come back paged, broker/restoring.py), `Engine.open` given a kept
index (broker/kept_index.py, built from the table's rows as a snapshot sends them; its
building is not timed) and the whole read both replaced (`restore_messages` over every
stored message, in a fresh core). The node's own collector thresholds apply
(pinmq/process.py). Prints each time and the ratios of the medians to the whole read.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from broker.config import NodeConfig, QueueConfig
from broker.core import BrokerCore
from broker.engine import Engine
from broker.kept_index import KeptIndex
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


def _kept(config: NodeConfig) -> KeptIndex:
    kept = KeptIndex()
    with sqlite3.connect(Path(config.node.data_dir) / "store.db") as conn:
        cursor = conn.execute("SELECT * FROM messages")
        columns = [c[0] for c in cursor.description]
        while rows := cursor.fetchmany(CHUNK):
            kept.add_rows(columns, rows)
    return kept


async def _by_index(config: NodeConfig, kept: KeptIndex | None = None) -> tuple[float, int]:
    """Seconds to open, and the depth of the queue then (paged messages included)."""
    engine = Engine(config)
    started = time.perf_counter()
    engine.open(kept)
    assert engine.restored_from == ("store index" if kept is None else "kept index")
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
        kept = _kept(config)
        ways = {"by index": _by_index, "kept index": partial(_by_index, kept=kept), "whole": _whole}
        times: dict[str, list[float]] = {way: [] for way in ways}
        depths: set[int] = set()
        for r in range(args.rounds):
            for way, run in ways.items():
                took, depth = await run(config)
                times[way].append(took)
                depths.add(depth)
                gc.collect()
            line = ", ".join(f"{way} {t[-1]:.2f} s" for way, t in times.items())
            print(f"round {r + 1}: {line}", flush=True)
    medians = {way: statistics.median(t) for way, t in times.items()}
    whole = medians["whole"]
    line = ", ".join(f"{way} {m:.2f} s ({m / whole:.2f})" for way, m in medians.items())
    print(f"open, median of {args.rounds} (ratio to whole): {line}")
    verdict = "PASS" if depths == {args.messages} else "FAIL"
    print(f"every message restored every way (depths {sorted(depths)}): {verdict}")
    return verdict == "PASS"


if __name__ == "__main__":
    sys.exit(0 if asyncio.run(main()) else 1)
