"""Store write throughput for 1 KiB persistent messages (every write() is committed + fsynced).

Scenarios: one task awaiting writes of 100 messages; 50 concurrent tasks each awaiting writes
of one message (group commit folds them); one task writing one message at a time (one fsync
per message: the floor). Usage: python bench/store_write.py [--dir DIR] [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import tempfile
import time
from pathlib import Path

from broker.message import Message
from broker.store import Store

BODY = os.urandom(1024)


def message(msg_id: int) -> Message:
    return Message(
        msg_id=msg_id,
        queue="bench",
        address="bench",
        body=BODY,
        headers={"JMSXGroupID": f"g-{msg_id % 100}"},
        persistent=True,
        enqueued_ns=time.time_ns(),
    )


async def run(path: Path, tasks: int, per_call: int, seconds: float) -> tuple[float, float]:
    """Messages/s and messages per commit for `tasks` writers, each awaiting `per_call`."""
    store = Store.open(path)
    ids = itertools.count(1)
    written = 0
    stop = time.perf_counter() + seconds

    async def writer() -> None:
        nonlocal written
        while time.perf_counter() < stop:
            await store.write(added=[message(next(ids)) for _ in range(per_call)])
            written += per_call

    start = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(tasks)))
    elapsed = time.perf_counter() - start
    commits = store.commits
    await store.close()
    return written / elapsed, written / max(commits, 1)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to put the store file")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each scenario")
    args = parser.parse_args()
    scenarios = [
        ("1 task x 100 msgs per write", 1, 100),
        ("50 tasks x 1 msg per write", 50, 1),
        ("1 task x 1 msg per write", 1, 1),
    ]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for n, (name, tasks, per_call) in enumerate(scenarios):
            rate, per_commit = await run(Path(tmp) / f"s{n}.db", tasks, per_call, args.seconds)
            print(f"{name:30} {rate:10,.0f} inserts/s  {per_commit:7.1f} msgs/commit")


if __name__ == "__main__":
    asyncio.run(main())
