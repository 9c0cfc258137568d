"""The durable store: round trips, call-order semantics, group commit, bounded disk, bad files,
and a real kill -9 of a writing process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from broker.message import Message
from broker.store import Store, StoreError
from broker.store_sql import APPLICATION_ID
from broker.store_writes import (
    DELIVERY_COUNT,
    DUPLICATE_ID,
    MARK,
    MESSAGE_KEY,
    STORED_MESSAGE,
    MessageWrite,
    StoreWrite,
)

KIB = 1024


def msg(msg_id: int, queue: str = "q", body: bytes = b"x", **kw: object) -> Message:
    kw.setdefault("persistent", True)
    return Message(msg_id=msg_id, queue=queue, address="addr", body=body, **kw)  # type: ignore[arg-type]


def naming(path: Path, problem: str) -> str:
    """A `match=` pattern: the error names the file, then the problem (a regex)."""
    return re.escape(str(path)) + ".*" + problem


def by_key(messages: list[Message]) -> dict[tuple[str, int], Message]:
    return {(m.queue, m.msg_id): m for m in messages}


@contextlib.contextmanager
def writer_blocked(path: Path) -> Iterator[None]:
    """Hold SQLite's write lock from another connection, so that calls made meanwhile queue
    up behind the writer thread and are committed together once it is released."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


async def let_tasks_run() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = Store.open(tmp_path / "data" / "store.db")
    yield s
    await s.close()


async def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "store.db"
    s = Store.open(path)
    assert s.load_messages() == []
    assert s.max_msg_id() == 0
    body = b"\x00\x01binary\x00\xff" * 100
    headers = {"JMSXGroupID": "g-1", "unicode": "żółw ✓", "empty": ""}
    a = msg(7, body=body, headers=headers, group="g-1", group_seq=3, enqueued_ns=123456789)
    await s.write(added=[a, a.copy_for("other"), msg(3, body=b""), msg(12, queue="a")])
    a.delivery_count = 2
    await s.write(updated=[a])
    await s.close()

    s = Store.open(path)
    loaded = s.load_messages()
    assert [(m.msg_id, m.queue) for m in loaded] == [(3, "q"), (7, "other"), (7, "q"), (12, "a")]
    got = by_key(loaded)[("q", 7)]
    assert got.body == body
    assert got.headers == headers
    assert got.delivery_count == 2
    assert (got.group, got.group_seq, got.enqueued_ns) == ("g-1", 3, 123456789)
    assert got.persistent
    assert by_key(loaded)[("other", 7)].delivery_count == 0
    assert by_key(loaded)[("q", 3)].body == b""
    assert s.max_msg_id() == 12
    await s.close()


async def test_reads_see_committed_writes_while_open(store: Store) -> None:
    await store.write(added=[msg(1), msg(2)])
    assert [m.msg_id for m in store.load_messages()] == [1, 2]
    assert store.max_msg_id() == 2


async def test_remove(store: Store) -> None:
    await store.write(added=[msg(1), msg(1, queue="r"), msg(2), msg(3)])
    await store.write(removed=[msg(1), msg(3)])
    assert sorted(by_key(store.load_messages())) == [("q", 2), ("r", 1)]
    # Removing something never stored, or twice, is harmless.
    await store.write(removed=[msg(1), msg(99)])
    assert sorted(by_key(store.load_messages())) == [("q", 2), ("r", 1)]


async def test_add_and_remove_in_the_same_call_and_batch(store: Store) -> None:
    await store.write(added=[msg(1), msg(2)], removed=[msg(1)])
    with writer_blocked(store.path):
        calls = [
            asyncio.create_task(store.write(added=[msg(3)])),
            asyncio.create_task(store.write(removed=[msg(3), msg(2)])),
            asyncio.create_task(store.write(added=[msg(4)])),
        ]
        await let_tasks_run()
    await asyncio.gather(*calls)
    assert [m.msg_id for m in store.load_messages()] == [4]
    assert store.max_msg_id() == 4  # a high-water mark: removed ids are not handed out again


async def test_calls_in_one_batch_apply_in_call_order(store: Store) -> None:
    await store.write(added=[msg(1, body=b"old")])
    m = msg(1, body=b"new")
    m.delivery_count = 5
    with writer_blocked(store.path):
        calls = [
            store.write(removed=[msg(1)]),
            store.write(updated=[m]),  # after the remove: nothing to update
            store.write(added=[msg(1, body=b"new")]),  # re-added
            store.write(updated=[m]),
            store.write(added=[msg(2)]),
            store.delete_queue("q2"),
            store.write(added=[msg(10, queue="q2")]),
            store.delete_queue("q2"),  # takes msg 10 with it
            store.save_queue("addr", "q2", {"v": 1}),
            store.write(added=[msg(11, queue="q2")]),
            store.write(updated=[msg(11, queue="q2", delivery_count=1)]),
        ]
        tasks = [asyncio.create_task(c) for c in calls]
        await let_tasks_run()
    await asyncio.gather(*tasks)
    loaded = by_key(store.load_messages())
    assert sorted(loaded) == [("q", 1), ("q", 2), ("q2", 11)]
    assert (loaded[("q", 1)].body, loaded[("q", 1)].delivery_count) == (b"new", 5)
    assert loaded[("q2", 11)].delivery_count == 1
    assert store.load_queues() == [("addr", "q2", {"v": 1})]


async def test_non_persistent_messages_are_ignored(store: Store) -> None:
    await store.write(added=[msg(1, persistent=False)], removed=[msg(2, persistent=False)])
    assert store.commits == 0  # nothing to wait for
    await store.write(added=[msg(3, persistent=False), msg(4)])
    assert [m.msg_id for m in store.load_messages()] == [4]
    assert store.max_msg_id() == 4


async def test_concurrent_writes_are_grouped_and_resolved_in_call_order(store: Store) -> None:
    done: list[int] = []

    async def one(i: int) -> None:
        await store.write(added=[msg(i)])
        done.append(i)

    with writer_blocked(store.path):
        tasks = [asyncio.create_task(one(i)) for i in range(1, 201)]
        await let_tasks_run()
    await asyncio.gather(*tasks)
    # The writer thread may have taken the first call before it blocked; all the others
    # were queued meanwhile and go in one transaction.
    assert store.commits <= 2
    assert done == list(range(1, 201))
    assert [m.msg_id for m in store.load_messages()] == list(range(1, 201))


async def test_many_concurrent_writers_all_land(store: Store) -> None:
    async def producer(p: int) -> None:
        for n in range(20):
            await store.write(added=[msg(p * 1000 + n)])

    await asyncio.gather(*(producer(p) for p in range(1, 51)))
    assert len(store.load_messages()) == 1000
    assert 1 <= store.commits <= 1000


async def test_queue_save_update_delete(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    s = Store.open(path)
    await s.save_queue("orders", "orders.eu", {"group-buckets": 16, "nested": {"a": [1, 2]}})
    await s.save_queue("orders", "orders.us", {})
    await s.save_queue("audit", "audit", {"durable": True})
    await s.save_queue("orders", "orders.eu", {"group-buckets": 32})  # keeps its place
    await s.write(added=[msg(1, queue="orders.us"), msg(1, queue="audit"), msg(2, queue="audit")])
    await s.delete_queue("audit")
    await s.close()

    s = Store.open(path)
    assert s.load_queues() == [
        ("orders", "orders.eu", {"group-buckets": 32}),
        ("orders", "orders.us", {}),
    ]
    assert sorted(by_key(s.load_messages())) == [("orders.us", 1)]
    await s.close()


async def test_failed_write_rejects_its_batch_and_later_writes_work(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "store.db", max_bytes=256 * KIB)  # SQLITE_FULL beyond this
    with pytest.raises(StoreError, match=naming(s.path, "write failed")):
        await s.write(added=[msg(1, body=b"x" * (1024 * KIB))])
    await s.write(added=[msg(2)])
    # In a grouped batch only the call that cannot fit fails.
    with writer_blocked(s.path):
        small = asyncio.create_task(s.write(added=[msg(3)]))
        big = asyncio.create_task(s.write(added=[msg(4, body=b"x" * (1024 * KIB))]))
        after = asyncio.create_task(s.write(added=[msg(5)]))
        await let_tasks_run()
    results = await asyncio.gather(small, big, after, return_exceptions=True)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], StoreError)
    assert [m.msg_id for m in s.load_messages()] == [2, 3, 5]
    await s.close()


async def test_duplicate_ids_keep_their_order_and_fold_within_a_batch(store: Store) -> None:
    await store.write(added=[msg(1)], ids=[("a", "x", 1), ("a", "y", 2), ("b", "x", 3)])
    with writer_blocked(store.path):
        calls = [
            store.write(ids=[("a", "z", 4), ("a", "x", None)]),  # evicted
            store.write(ids=[("a", "x", 5)]),  # accepted again: the newest
            store.write(ids=[("b", "t", 6), ("b", "t", None)]),  # in and out: never stored
            store.write(ids=[("a", "nothing", None)]),  # forgetting what is not there
        ]
        tasks = [asyncio.create_task(c) for c in calls]
        await let_tasks_run()
    await asyncio.gather(*tasks)
    assert store.load_ids() == [("a", "y", 2), ("b", "x", 3), ("a", "z", 4), ("a", "x", 5)]


async def test_an_id_is_written_in_the_transaction_of_its_message(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "store.db", max_bytes=256 * KIB)  # SQLITE_FULL beyond this
    with pytest.raises(StoreError, match="write failed"):
        await s.write(added=[msg(1, body=b"x" * (1024 * KIB))], ids=[("a", "big", 1)])
    await s.write(added=[msg(2)], ids=[("a", "small", 2)])
    assert [m.msg_id for m in s.load_messages()] == [2]
    assert s.load_ids() == [("a", "small", 2)]  # neither the message nor its id went in
    await s.close()


async def test_a_store_of_schema_version_1_opens_and_gains_the_id_table(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    s = Store.open(path)
    await s.save_queue("addr", "q", {})
    await s.write(added=[msg(1), msg(2)])
    await s.close()
    # What the previous version left: no duplicate_ids table, user_version 1.
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("DROP TABLE duplicate_ids")
        conn.execute("PRAGMA user_version = 1")

    s = Store.open(path)
    assert [m.msg_id for m in s.load_messages()] == [1, 2]
    assert s.load_queues() == [("addr", "q", {})] and s.load_ids() == []
    await s.write(ids=[("addr", "x", 2)])
    assert s.load_ids() == [("addr", "x", 2)]
    await s.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2


def test_a_store_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        conn.execute("PRAGMA user_version = 99")
    before = path.read_bytes()
    with pytest.raises(StoreError, match=naming(path, "schema version 99 is newer")):
        Store.open(path)
    assert path.read_bytes() == before


async def test_a_write_that_finds_no_room_frees_the_reserve_then_waits_until_close(
    tmp_path: Path,
) -> None:
    """With `on_full` a write that does not fit is not failed: the reserve goes first, then
    the write waits for space; only closing the store gives up on it."""
    reserve = ["held"]

    def on_full() -> bool:
        freed = bool(reserve)
        reserve.clear()
        return freed

    s = Store.open(tmp_path / "store.db", max_bytes=256 * KIB, on_full=on_full)
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
    reopened = Store.open(tmp_path / "store.db")
    assert [m.msg_id for m in reopened.load_messages()] == [1]
    await reopened.close()


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
    deadline = time.monotonic() + 60  # liveness only: compaction runs when the writer is idle
    while store.compactions == 0 or store.disk_bytes() > 2 * 1024 * KIB:
        assert time.monotonic() < deadline, (store.compactions, store.disk_bytes())
        await asyncio.sleep(0.01)
    await store.write(added=[msg(10**6)])
    assert [m.msg_id for m in store.load_messages()] == [10**6]


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


async def test_a_write_record_holds_what_its_fields_are_named(store: Store) -> None:
    """The tuples of a write record go on the replication wire as they are, in the order the
    store names their fields (cluster/replication_wire.py): the names must be true."""
    seen: list[StoreWrite] = []
    store.tap = seen.append
    m = msg(7, queue="q", body=b"b", headers={"h": "v"}, delivery_count=2, group="g")
    m.group_seq, m.enqueued_ns = 3, 9
    await store.write([m], [m], [m], {"node2": 4}, [m], [("addr", "d", 7)])
    [w] = seen
    assert isinstance(w, MessageWrite)
    assert [dict(zip(STORED_MESSAGE, row, strict=True)) for row in w.added] == [
        {
            "msg_id": 7,
            "queue": "q",
            "address": "addr",
            "headers": '{"h":"v"}',
            "delivery_count": 2,
            "group": "g",
            "group_seq": 3,
            "enqueued_ns": 9,
            "body": b"b",
        }
    ]
    assert [dict(zip(MESSAGE_KEY, key, strict=True)) for key in w.removed] == [
        {"msg_id": 7, "queue": "q"}
    ]
    assert [dict(zip(DELIVERY_COUNT, count, strict=True)) for count in w.counts] == [
        {"count": 2, "msg_id": 7, "queue": "q"},  # updated
        {"count": 3, "msg_id": 7, "queue": "q"},  # delivered once more
    ]
    assert [dict(zip(MARK, mark, strict=True)) for mark in w.marks] == [
        {"origin": "node2", "seq": 4}
    ]
    assert [dict(zip(DUPLICATE_ID, i, strict=True)) for i in w.ids] == [
        {"address": "addr", "dup_id": "d", "msg_id": 7}
    ]


async def test_a_store_applying_another_stores_records_reads_back_the_same(
    tmp_path: Path,
) -> None:
    """What a backup's store does with the records the primary's tap saw (ha), on one machine."""
    first, second = Store.open(tmp_path / "first.db"), Store.open(tmp_path / "second.db")
    seen: list[StoreWrite] = []
    first.tap = seen.append
    try:
        m = msg(1, headers={"h": "v"}, group="g")
        await first.save_queue("addr", "q", {"k": 1})
        await first.save_queue("addr", "gone", {})
        await first.write(added=[m, msg(2), msg(3, queue="gone")], ids=[("addr", "d", 1)])
        await first.write(delivered=[m], marks={"node2": 3})
        await first.write(removed=[msg(2)], ids=[("addr", "d", None)])
        await first.delete_queue("gone")
        assert [type(r).__name__ for r in seen] == [
            "QueueSaved",
            "QueueSaved",
            "MessageWrite",
            "MessageWrite",
            "MessageWrite",
            "QueueDeleted",
        ]
        await asyncio.gather(*(second.apply(record) for record in seen))
        for read in ("load_queues", "load_messages", "load_marks", "load_ids", "max_msg_id"):
            assert getattr(second, read)() == getattr(first, read)(), read
        assert [(m.msg_id, m.delivery_count) for m in second.load_messages()] == [(1, 1)]
    finally:
        await first.close()
        await second.close()


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
    store = Store.open(Path(sys.argv[1]))
    await asyncio.gather(rounds(store), *(singles(store, t) for t in range(8)))

asyncio.run(main())
"""


@pytest.mark.slow
def test_kill_9_loses_nothing_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASH_CHILD, str(path)],
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

    s = Store.open(path)  # must open cleanly after the crash
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
