"""The durable store's disk: a full disk and the reserve, bounded growth and compaction, files
that are not stores, and a real kill -9 of a writing process."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from store_harness import KIB, by_key, let_tasks_run, msg, naming, writer_blocked
from structlog.testing import capture_logs

from broker import store as store_module
from broker.journal_store import JournalStore
from broker.store import COMPACT_AFTER_DELETES, Store, StoreError


@pytest.mark.parametrize("kind", [Store, JournalStore])
async def test_a_write_that_finds_no_room_frees_the_reserve_then_waits_until_close(
    tmp_path: Path, kind: type[Store] | type[JournalStore]
) -> None:
    """With `on_full` a write that does not fit is not failed: the reserve goes first, then
    the write waits for space; only closing the store gives up on it."""
    reserve = ["held"]

    def on_full() -> bool:
        freed = bool(reserve)
        reserve.clear()
        return freed

    s = kind.open(tmp_path / "store", max_bytes=256 * KIB, on_full=on_full)
    await s.write(added=[msg(1)])
    big = asyncio.create_task(s.write(added=[msg(2, body=b"x" * (1024 * KIB))]))
    for _ in range(200):
        if s.waiting_for_space:
            break
        await asyncio.sleep(0.01)
    assert s.waiting_for_space and reserve == [] and not big.done()
    await s.close()
    with pytest.raises(StoreError, match="write failed"):
        await big
    reopened = kind.open(tmp_path / "store")
    assert [m.msg_id for m in reopened.load_messages()] == [1]
    await reopened.close()


async def test_a_store_that_cannot_write_warns_once_until_a_write_succeeds_again(
    tmp_path: Path,
) -> None:
    """Without `on_full` (a backup's store) a write that does not fit fails. A full disk fails
    every write: one warning says so, not one a write, and one line says when writes succeed
    again."""
    s = Store.open(tmp_path / "store", max_bytes=256 * KIB)
    try:
        with capture_logs() as logged:
            for n in range(2, 6):
                with pytest.raises(StoreError, match="write failed"):
                    await s.write(added=[msg(n, body=b"x" * (1024 * KIB))])
            await s.write(added=[msg(1)])
            with pytest.raises(StoreError, match="write failed"):
                await s.write(added=[msg(6, body=b"x" * (1024 * KIB))])
    finally:
        await s.close()
    said = [(e["log_level"], e["event"]) for e in logged if e["log_level"] != "debug"]
    assert said == [
        ("warning", "store write failed"),
        ("info", "store writes succeed again"),
        ("warning", "store write failed"),
    ]


async def test_cancelling_the_waiter_does_not_cancel_the_write(store: Store) -> None:
    with writer_blocked(store.path):
        task = asyncio.create_task(store.write(added=[msg(1)]))
        await let_tasks_run()
        task.cancel()
    await store.write(added=[msg(2)])
    assert [m.msg_id for m in store.load_messages()] == [1, 2]


async def test_closed_store_refuses_work_and_close_is_idempotent(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "store.db")
    await s.write(added=[msg(1)])
    await s.close()
    await s.close()
    with pytest.raises(StoreError, match="closed"):
        await s.write(added=[msg(2)])
    assert not Path(str(s.path) + "-wal").exists()  # checkpointed away at close
    assert [m.msg_id for m in s.load_messages()] == [1]


async def test_churn_keeps_disk_bounded(store: Store) -> None:
    body = os.urandom(KIB)
    peak = 0
    for r in range(50):
        batch = [msg(r * 1000 + i, body=body) for i in range(1000)]
        await store.write(added=batch)
        await store.write(removed=batch)
        peak = max(peak, store.disk_bytes())
    # 50,000 KiB went through; free pages are reused and the WAL is capped.
    assert peak < 12 * 1024 * KIB, peak
    assert store.load_messages() == []


async def test_compaction_returns_space_after_a_backlog_drains(store: Store) -> None:
    body = os.urandom(KIB)
    batches = [[msg(r * 1000 + i, body=body) for i in range(1000)] for r in range(50)]
    for batch in batches:
        await store.write(added=batch)
    assert store.disk_bytes() > 50_000 * KIB
    for batch in batches:
        await store.write(removed=batch)
    # A compaction runs when the writer is idle after COMPACT_AFTER_DELETES deletes: one may
    # finish before the last batches are deleted (the writer idles between the awaited
    # writes), and fewer deletes than that after it wait for more, so what is left free is
    # bounded by those, not zero.
    left = 2 * 1024 * KIB + COMPACT_AFTER_DELETES * 2 * KIB
    deadline = time.monotonic() + 60  # liveness only
    while store.compactions == 0 or store.disk_bytes() > left:
        assert time.monotonic() < deadline, (store.compactions, store.disk_bytes())
        await asyncio.sleep(0.01)
    await store.write(added=[msg(10**6)])
    assert [m.msg_id for m in store.load_messages()] == [10**6]


async def test_a_compaction_does_not_wait_for_a_snapshot_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backup's snapshot holds a read for as long as it streams (a minute at a million
    messages); a compaction's WAL truncation waiting for it held every commit behind it for
    the busy timeout (5 s). Made an hour here, so that a wait cannot pass the test."""
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_MS", 3_600_000)
    s = Store.open(tmp_path / "store.db")
    try:
        batch = [msg(i) for i in range(COMPACT_AFTER_DELETES)]
        await s.write(added=batch)
        pinned, pinning = s.snapshot()
        await pinning
        await s.write(removed=batch)  # the writer, idle after it, compacts
        deadline = time.monotonic() + 60  # liveness only
        while s.compactions == 0:
            assert time.monotonic() < deadline, "the compaction waits for the read"
            await asyncio.sleep(0.01)
        await s.write(added=[msg(10**6)])
        assert pinned.conn is not None  # the read still sees the store as it was pinned
        assert sum(len(rows) for rows in pinned.rows("messages", 1000)) == len(batch)
        pinned.close()
        assert [m.msg_id for m in s.load_messages()] == [10**6]
    finally:
        await s.close()


async def test_close_compacts(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "store.db")
    batch = [msg(i, body=os.urandom(KIB)) for i in range(5000)]  # below the idle threshold
    await s.write(added=batch)
    await s.write(removed=batch)
    await s.close()
    assert s.disk_bytes() < 256 * KIB


def test_garbage_file_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    garbage = os.urandom(64 * KIB)
    path.write_bytes(garbage)
    with pytest.raises(StoreError, match=naming(path, "not a SQLite")):
        Store.open(path)
    assert path.read_bytes() == garbage


def test_short_garbage_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    path.write_bytes(b"hello")
    with pytest.raises(StoreError, match=naming(path, "not a SQLite")):
        Store.open(path)
    assert path.read_bytes() == b"hello"


async def test_truncated_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    s = Store.open(path)
    await s.write(added=[msg(i, body=os.urandom(KIB)) for i in range(2000)])
    await s.close()
    data = path.read_bytes()
    half = data[: len(data) // 2]
    path.write_bytes(half)
    with pytest.raises(StoreError, match=naming(path, "truncated")):
        Store.open(path)
    assert path.read_bytes() == half


async def test_truncated_database_with_stale_header_count_is_refused(tmp_path: Path) -> None:
    # Old SQLite versions leave the header page count unset; quick_check must catch it then.
    path = tmp_path / "store.db"
    s = Store.open(path)
    await s.write(added=[msg(i, body=os.urandom(KIB)) for i in range(2000)])
    await s.close()
    data = bytearray(path.read_bytes())
    data[92:96] = (int.from_bytes(data[92:96], "big") + 1).to_bytes(4, "big")
    half = bytes(data[: len(data) // 2])
    path.write_bytes(half)
    with pytest.raises(StoreError, match=naming(path, "corrupt")):
        Store.open(path)
    assert path.read_bytes() == half


async def test_corrupted_page_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    s = Store.open(path)
    await s.write(added=[msg(i, body=os.urandom(KIB)) for i in range(500)])
    await s.close()
    data = bytearray(path.read_bytes())
    data[8192:12288] = os.urandom(4096)  # scribble over page 3
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=naming(path, "corrupt")):
        Store.open(path)
    assert path.read_bytes() == bytes(data)


def test_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match=naming(path, "not a pinmq store")):
        Store.open(path)
    assert path.read_bytes() == before


async def test_empty_file_becomes_a_store(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    path.touch()
    s = Store.open(path)
    await s.write(added=[msg(1)])
    await s.close()
    s = Store.open(path)
    assert [m.msg_id for m in s.load_messages()] == [1]
    await s.close()


# A producer process: one task writes batches (adds of round k, and removes / count updates
# of round k-3), eight tasks write single messages; each prints what was acknowledged.
CRASH_CHILD = r"""
import asyncio, sys
from pathlib import Path
from broker.message import Message
from broker import store as store_module
from broker.journal_store import JournalStore
from broker.store import Store

def m(msg_id, queue, count=0):
    return Message(msg_id=msg_id, queue=queue, address="a", body=b"b" * 200, headers={"k": "v"},
                   persistent=True, delivery_count=count)

async def rounds(store):
    k = 0
    while True:
        old = k - 3
        removed = [m(10 * old + i, "q") for i in range(1, 11, 2)] if old >= 0 else []
        updated = [m(10 * old + i, "q", k) for i in range(2, 11, 2)] if old >= 0 else []
        added = [m(10 * k + i, "q") for i in range(1, 11)]
        await store.write(added=added, removed=removed, updated=updated)
        print("R", k, flush=True)
        k += 1

async def singles(store, t):
    n = 0
    while True:
        msg_id = 10**9 + t * 10**6 + n
        await store.write(added=[m(msg_id, "p")])
        print("P", msg_id, flush=True)
        n += 1

async def main():
    kind = JournalStore if sys.argv[2] == "journal" else Store
    store = kind.open(Path(sys.argv[1]))
    await asyncio.gather(rounds(store), *(singles(store, t) for t in range(8)))

asyncio.run(main())
"""


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["sqlite", "journal"])
def test_kill_9_loses_nothing_acknowledged(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / ("journal" if fmt == "journal" else "store.db")
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASH_CHILD, str(path), fmt],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    acked: list[str] = []
    rounds_acked = 0
    first_ack: float | None = None
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                line = lines.get(timeout=0.05)
                acked.append(line)
                rounds_acked += line.startswith("R ")
                first_ack = first_ack or time.monotonic()
            except queue.Empty:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            if first_ack and time.monotonic() - first_ack > 1 and rounds_acked >= 10:
                break
            assert time.monotonic() < deadline, "the child acknowledged too little"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    reader.join()
    while not lines.empty():
        acked.append(lines.get())
    assert proc.returncode == -signal.SIGKILL

    complete = [line.split() for line in acked if line.endswith("\n")]
    last_round = max(int(n) for kind, n in complete if kind == "R")
    singles = [int(n) for kind, n in complete if kind == "P"]
    assert singles

    s = (JournalStore if fmt == "journal" else Store).open(path)  # opens cleanly after the crash
    stored = by_key(s.load_messages())
    lost = [msg_id for msg_id in singles if ("p", msg_id) not in stored]
    assert not lost, f"{len(lost)} of {len(singles)} acknowledged single writes lost: {lost[:5]}"
    for j in range(last_round + 1):
        removed_by = j + 3  # round that removes odd ids / updates even ids of round j
        for i in range(1, 11):
            got = stored.get(("q", 10 * j + i))
            if i % 2:
                if removed_by <= last_round:
                    assert got is None, (j, i)
                elif removed_by > last_round + 1:
                    assert got is not None, (j, i)
            else:
                assert got is not None, (j, i)
                if removed_by <= last_round:
                    assert got.delivery_count == removed_by, (j, i)
                elif removed_by > last_round + 1:
                    assert got.delivery_count == 0, (j, i)
    assert all(msg_id <= 10 * (last_round + 2) for q, msg_id in stored if q == "q")
    asyncio.run(s.close())
