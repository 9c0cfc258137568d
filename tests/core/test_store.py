"""The durable store: round trips, call-order semantics, group commit, schema versions, and
the write records it applies and hands to replication. Its disk space, bad files and a kill
-9 of a writing process are tests/core/test_store_files.py."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

import pytest
from store_harness import KIB, by_key, let_tasks_run, msg, naming, writer_blocked

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
