"""The index an ha backup keeps while it follows (`broker/kept_index.py`) is the index a start
would scan from the store it follows into: the same messages, a run per group in msg id order,
after any run of adds, removals, replaces, count changes and queue deletions, from a
snapshot's rows or from writes. A real SQLite store takes the same writes."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from broker.kept_index import KeptIndex
from broker.store import Store
from broker.store_reads import IndexRun
from broker.store_writes import MessageWrite, QueueDeleted, QueueSaved, StoredMessage

QUEUES = ("a", "b", "c")


def _row(msg_id: int, queue: str, rng: random.Random) -> StoredMessage:
    group = rng.choice([None, "g1", "g2", "g3"])
    return (msg_id, queue, queue, "{}", 0, group, 0, msg_id * 1000, b"x")


def _writes(rng: random.Random, n: int) -> list[MessageWrite | QueueSaved | QueueDeleted]:
    """Random store writes: ids mostly ascending, sometimes late (a forwarded message, a copy
    per queue), held ones stored again (maybe in another group), removals of held ones, count
    changes, a queue deleted and saved again."""
    held: list[tuple[int, str]] = []
    out: list[MessageWrite | QueueSaved | QueueDeleted] = []
    next_id = 1
    for _ in range(n):
        roll = rng.random()
        if roll < 0.03:
            queue = rng.choice(QUEUES)
            out += [QueueDeleted(queue), QueueSaved(queue, queue, "{}")]
            held = [key for key in held if key[1] != queue]
            continue
        added: list[StoredMessage] = []
        for _ in range(rng.randrange(4)):
            msg_id = next_id if rng.random() < 0.9 else max(1, next_id - rng.randrange(1, 50))
            next_id += 1
            for queue in rng.sample(QUEUES, rng.randrange(1, 3)):
                if (msg_id, queue) not in held:
                    added.append(_row(msg_id, queue, rng))
                    held.append((msg_id, queue))
        if held and rng.random() < 0.1:  # a held message stored again: its row replaced
            added.append(_row(*rng.choice(held), rng))
        removed = [held.pop(rng.randrange(len(held))) for _ in range(rng.randrange(3)) if held]
        counts = [(1, *key) for key in rng.sample(held, min(len(held), rng.randrange(2)))]
        out.append(MessageWrite(added=added, removed=removed, counts=counts))
    return out


@pytest.mark.parametrize("seed", range(6))
async def test_the_kept_index_is_the_scanned_one_after_random_writes(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    store = Store.open(tmp_path / "store.db")
    kept = KeptIndex()
    try:
        for queue in QUEUES:
            await store.apply(QueueSaved(queue, queue, "{}"))
        for write in _writes(rng, 300):
            await store.apply(write)
            kept.apply(write)
        scanned = _runs(store.index() or [])
        count = store.message_count()
    finally:
        await store.close()
    assert len(kept) == sum(len(ids) for ids, _ in scanned.values()) == count > 0
    assert _runs(kept.runs()) == scanned  # the same messages, groups, order and newest time

    # A snapshot sends the same table as rows, in any order: the index it makes is the same.
    conn = sqlite3.connect(tmp_path / "store.db")
    cursor = conn.execute("SELECT * FROM messages")
    columns = [c[0] for c in cursor.description]
    table = cursor.fetchall()
    conn.close()
    rng.shuffle(table)
    from_rows = KeptIndex()
    from_rows.add_rows(columns, table)
    assert _runs(from_rows.runs()) == scanned


def _runs(runs: list[IndexRun]) -> dict[tuple[str, str | None], tuple[list[int], int]]:
    """Runs by (queue, group): their ids and newest time (the order runs come in is free)."""
    out = {(r.queue, r.group): (r.msg_ids.tolist(), r.enqueued_ns) for r in runs}
    assert len(out) == len(runs)  # one run per group
    return out
