"""The journal store format (`store.format: journal`): it reads back what the SQLite store reads
back for the same writes, rolls its segments without losing what lives in them, cuts off a
write a crash tore, refuses damage, and is never opened over the other format's files."""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import astuple
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from store_harness import KIB, msg, naming
from structlog.testing import capture_logs

from broker.config_file import ConfigError, parse_config
from broker.journal import SUFFIX
from broker.journal_store import JournalStore
from broker.message import Message
from broker.store import Store
from broker.store_base import StoreBase
from broker.store_files import JOURNAL_DIR, STORE_FILE, open_store, store_format
from broker.store_reads import StoreError

SMALL = 64 * KIB  # segments small enough that a few hundred messages roll several


def contents(store: StoreBase) -> dict[str, Any]:
    """Everything a store reads back, in comparable form."""
    return {
        "messages": [astuple(m) for m in store.load_messages()],
        "queues": store.load_queues(),
        "marks": store.load_marks(),
        "ids": store.load_ids(),
        "max_id": store.max_msg_id(),
    }


# ---- the same writes, both formats ------------------------------------------------------------

KEYS = st.tuples(st.integers(1, 12), st.sampled_from(["q1", "q2"]))


def _message(key: tuple[int, str], count: int, body_size: int) -> Message:
    msg_id, queue = key
    return msg(
        msg_id,
        queue,
        body=bytes([msg_id % 251]) * body_size,
        headers={"h": str(msg_id), "JMSXGroupID": f"g{msg_id % 3}"},
        delivery_count=count,
        group=f"g{msg_id % 3}" if msg_id % 4 else None,
        group_seq=msg_id,
        enqueued_ns=msg_id * 1000,
    )


WRITE = st.fixed_dictionaries(
    {
        "added": st.lists(st.tuples(KEYS, st.integers(0, 3), st.integers(0, 3000)), max_size=4),
        "removed": st.lists(KEYS, max_size=3),
        "updated": st.lists(st.tuples(KEYS, st.integers(0, 9)), max_size=2),
        "delivered": st.lists(KEYS, max_size=2),
        "marks": st.dictionaries(st.sampled_from(["n1", "n2"]), st.integers(0, 30), max_size=2),
        "ids": st.lists(
            st.tuples(st.just("addr"), st.sampled_from(["d1", "d2", "d3"]), st.none() | KEYS),
            max_size=2,
        ),
    }
)
QUEUE_OP = st.tuples(
    st.sampled_from(["save", "delete"]), st.sampled_from(["q1", "q2"]), st.integers(0, 5)
)
STEP = st.one_of(WRITE, QUEUE_OP)


async def _run(store: StoreBase, steps: list[Any]) -> None:
    for step in steps:
        if isinstance(step, tuple):
            kind, queue, prefetch = step
            if kind == "save":
                await store.save_queue("addr", queue, {"prefetch": prefetch})
            else:
                await store.delete_queue(queue)
            continue
        await store.write(
            added=[_message(k, c, size) for k, c, size in step["added"]],
            removed=[_message(k, 0, 0) for k in step["removed"]],
            updated=[_message(k, c, 0) for k, c in step["updated"]],
            delivered=[_message(k, 0, 0) for k in step["delivered"]],
            marks=step["marks"],
            ids=[(a, d, None if k is None else k[0]) for a, d, k in step["ids"]],
        )


async def _both(directory: Path, steps: list[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    sqlite = Store.open(directory / STORE_FILE)
    journal = JournalStore.open(directory / JOURNAL_DIR, segment_bytes=4 * KIB)
    await asyncio.gather(_run(sqlite, steps), _run(journal, steps))
    live = contents(journal)
    assert live == contents(sqlite), "the journal's index reads back what SQLite holds"
    await sqlite.close()
    await journal.close()
    sqlite = Store.open(directory / STORE_FILE)
    journal = JournalStore.open(directory / JOURNAL_DIR, segment_bytes=4 * KIB)
    try:
        return contents(sqlite), contents(journal)
    finally:
        await sqlite.close()
        await journal.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(STEP, max_size=25))
@example(  # added and removed in one write: its id is still taken, never given again
    [
        {
            "added": [((1, "q1"), 0, 0)],
            "removed": [(1, "q1")],
            "updated": [],
            "delivered": [],
            "marks": {},
            "ids": [],
        }
    ]
)
def test_the_journal_reads_back_what_sqlite_reads_back_for_the_same_writes(
    steps: list[Any],
) -> None:
    """Adds, removals, counts, delivered counts, marks, duplicate ids and queue operations in
    any order, through 4 KiB segments that roll all the time, and after a reopen."""
    with tempfile.TemporaryDirectory() as tmp:
        sqlite, journal = asyncio.run(_both(Path(tmp), steps))
    assert journal == sqlite


async def test_a_frame_of_more_buffers_than_one_writev_takes_reads_back(tmp_path: Path) -> None:
    """A write of 600 messages is a frame of 1,800 buffers, over IOV_MAX (1,024)."""
    s = JournalStore.open(tmp_path)
    sent = [msg(i, body=b"%d" % i * 7, headers={"k": str(i)}) for i in range(1, 601)]
    await s.write(added=sent)
    before = contents(s)
    await s.close()
    reopened = JournalStore.open(tmp_path)
    assert contents(reopened) == before
    assert [(m.msg_id, m.body, m.headers) for m in reopened.load_messages()] == [
        (m.msg_id, m.body, m.headers) for m in sent
    ]
    await reopened.close()


# ---- rolling segments -------------------------------------------------------------------------


async def test_rolling_keeps_what_lives_and_bounds_the_disk(tmp_path: Path) -> None:
    """A long-lived message (its delivery count raised), a queue, a mark and a duplicate id
    outlive a FIFO churn many segments long; the journal stays a few segments big."""
    s = JournalStore.open(tmp_path, segment_bytes=SMALL)
    await s.save_queue("addr", "q", {"a": 1})
    keeper = msg(1, body=b"k" * 500, headers={"JMSXGroupID": "g"}, group="g")
    await s.write(added=[keeper], marks={"node2": 7}, ids=[("addr", "dup-1", 1)])
    await s.write(delivered=[keeper])
    biggest = 0
    for i in range(2, 1002):
        await s.write(added=[msg(i, body=b"x" * 1024)])
        if i > 21:  # the 20 newest stay
            await s.write(removed=[msg(i - 20)])
        biggest = max(biggest, s.disk_bytes())
    assert s.compactions >= 10, "about 1 MiB through 64 KiB segments rolls many"
    assert biggest < 6 * SMALL, f"the journal grew to {biggest} bytes"
    before = contents(s)
    await s.close()
    reopened = JournalStore.open(tmp_path, segment_bytes=SMALL)
    assert contents(reopened) == before
    first = reopened.load_messages()[0]
    assert (first.msg_id, first.delivery_count, first.group, first.body) == (1, 1, "g", b"k" * 500)
    assert reopened.load_queues() == [("addr", "q", {"a": 1})]
    assert reopened.load_marks() == {"node2": 7}
    assert reopened.load_ids() == [("addr", "dup-1", 1)]
    assert [m.msg_id for m in reopened.load_messages()][1:] == list(range(982, 1002))
    await reopened.close()


async def test_paged_reads_find_messages_a_roll_moved(tmp_path: Path) -> None:
    s = JournalStore.open(tmp_path, segment_bytes=SMALL)
    await s.write(added=[msg(i, body=b"p" * 100) for i in range(1, 6)])
    for i in range(6, 300):  # churn past the five: their segment is rolled
        await s.write(added=[msg(i, body=b"x" * 1024)])
        await s.write(removed=[msg(i)])
    assert s.compactions
    await s.write(updated=[msg(3, delivery_count=4)])
    [page] = await asyncio.to_thread(s.read_ids, "q", [[5, 3, 1, 99]])
    assert [(m.msg_id, m.delivery_count, m.body) for m in page] == [
        (1, 0, b"p" * 100),
        (3, 4, b"p" * 100),
        (5, 0, b"p" * 100),
    ]
    await s.close()


async def test_give_back_space_rolls_whatever_holds_dead_bytes(tmp_path: Path) -> None:
    s = JournalStore.open(tmp_path, segment_bytes=SMALL)
    await s.write(added=[msg(i, body=b"x" * 1024) for i in range(1, 200)])
    await s.write(removed=[msg(i) for i in range(1, 200, 2)])  # every segment half dead
    before = s.disk_bytes()
    s.give_back_space()
    await s.write(added=[msg(500)])  # the next write comes after the rolls
    assert s.disk_bytes() < before * 0.7
    assert len(s.load_messages()) == 100
    await s.close()


# ---- crashes and damage -----------------------------------------------------------------------


def _segments(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{SUFFIX}"))


async def test_a_write_torn_by_a_crash_is_cut_off_with_a_warning(tmp_path: Path) -> None:
    s = JournalStore.open(tmp_path)
    await s.write(added=[msg(1), msg(2)])
    await s.close()
    [segment] = _segments(tmp_path)
    whole = segment.stat().st_size
    with segment.open("ab") as f:  # a frame header promising 1000 bytes, 10 of them written
        f.write((1000).to_bytes(4, "little") + b"\x00" * 4 + b"y" * 10)
    with capture_logs() as logs:
        reopened = JournalStore.open(tmp_path)
    assert [m.msg_id for m in reopened.load_messages()] == [1, 2]
    assert segment.stat().st_size == whole
    assert [e["event"] for e in logs] == ["journal: cut off a write a crash interrupted"]
    await reopened.write(added=[msg(3)])  # and it goes on from there
    await reopened.close()
    again = JournalStore.open(tmp_path)
    assert [m.msg_id for m in again.load_messages()] == [1, 2, 3]
    await again.close()


async def test_a_segment_a_crash_caught_being_created_goes(tmp_path: Path) -> None:
    s = JournalStore.open(tmp_path)
    await s.write(added=[msg(1)])
    await s.close()
    torn = tmp_path / "00000002.seg"
    torn.write_bytes(b"\x21\x00\x00\x00\x00")  # its head frame, cut short
    reopened = JournalStore.open(tmp_path)
    assert not torn.exists()
    await reopened.write(added=[msg(2)])
    await reopened.close()
    again = JournalStore.open(tmp_path)
    assert [m.msg_id for m in again.load_messages()] == [1, 2]
    await again.close()


async def test_damage_inside_the_log_is_refused_and_left_alone(tmp_path: Path) -> None:
    s = JournalStore.open(tmp_path, segment_bytes=SMALL)
    await s.write(added=[msg(1, body=b"a" * 1024)])
    await s.write(added=[msg(i, body=b"x" * 1024) for i in range(2, 80)])  # into a 2nd segment
    await s.close()
    first = _segments(tmp_path)[0]
    data = bytearray(first.read_bytes())
    data[100] ^= 0xFF  # inside msg 1's frame
    first.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=naming(first, "corrupt at offset")):
        JournalStore.open(tmp_path, segment_bytes=SMALL)
    assert first.read_bytes() == bytes(data)


async def test_a_bad_frame_with_a_whole_one_after_it_is_damage_not_a_torn_write(
    tmp_path: Path,
) -> None:
    s = JournalStore.open(tmp_path)
    for i in range(1, 4):
        await s.write(added=[msg(i)])
    await s.close()
    [segment] = _segments(tmp_path)
    data = bytearray(segment.read_bytes())
    frame_of_2 = data.index(b"\x02\x00\x00\x00\x00\x00\x00\x00", 40) - 8  # msg id 2, LE
    data[frame_of_2 + 30] ^= 0xFF
    segment.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="corrupt"):
        JournalStore.open(tmp_path)
    assert segment.read_bytes() == bytes(data)


def test_a_file_that_is_no_segment_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "00000001.seg"
    text.write_bytes(b"these are my notes, not a journal segment\n" * 3)
    with pytest.raises(StoreError, match=naming(text, "not a journal segment")):
        JournalStore.open(tmp_path)
    assert text.read_bytes() == b"these are my notes, not a journal segment\n" * 3
    text.unlink()
    (tmp_path / "notes.seg").write_bytes(b"")
    with pytest.raises(StoreError, match=naming(tmp_path / "notes.seg", "not a journal segment")):
        JournalStore.open(tmp_path)


# ---- the node's choice ------------------------------------------------------------------------


def _config(tmp_path: Path, fmt: str) -> Any:
    return parse_config(f"node: {{id: n1, data-dir: {tmp_path}}}\nstore: {{format: {fmt}}}", "n")


@pytest.mark.parametrize(
    ("first", "then", "files", "problem"),
    [
        ("journal", "sqlite", JOURNAL_DIR, "holds a journal store"),
        ("sqlite", "journal", STORE_FILE, "holds a sqlite store"),
    ],
)
async def test_a_node_never_opens_the_other_formats_files(
    tmp_path: Path, first: str, then: str, files: str, problem: str
) -> None:
    store = open_store(_config(tmp_path, first), None)
    await store.write(added=[msg(1)])
    await store.close()
    with pytest.raises(StoreError, match=naming(tmp_path / files, problem)):
        open_store(_config(tmp_path, then), None)
    assert sorted(p.name for p in tmp_path.iterdir()) == [files]  # nothing made beside it


async def test_auto_takes_the_journal_for_a_new_directory_and_keeps_a_sqlite_store(
    tmp_path: Path,
) -> None:
    fresh = parse_config(f"node: {{id: n1, data-dir: {tmp_path / 'new'}}}", "n")
    assert fresh.store.format == "auto" and store_format(fresh) == "journal"
    store = open_store(fresh, None)
    await store.write(added=[msg(1)])
    await store.close()
    assert store_format(fresh) == "journal"
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == [JOURNAL_DIR]
    old = _config(tmp_path / "old", "sqlite")  # a node from before the journal
    store = open_store(old, None)
    await store.write(added=[msg(1)])
    await store.close()
    upgraded = parse_config(f"node: {{id: n1, data-dir: {tmp_path / 'old'}}}", "n")
    assert store_format(upgraded) == "sqlite"
    store = open_store(upgraded, None)
    assert [m.msg_id for m in store.load_messages()] == [1]
    await store.close()
    pair = parse_config(
        f"node: {{id: node1, data-dir: {tmp_path / 'pair'}}}\n"
        "cluster: {connectors: ['127.0.0.1:7702']}\n"
        "grouping-handler: {type: LOCAL}\nha: {role: primary}",
        "p.yaml",
    )
    assert store_format(pair) == "sqlite"


def test_an_ha_pair_keeps_the_sqlite_format() -> None:
    text = (
        "node: {id: node1}\ncluster: {connectors: ['127.0.0.1:7702']}\n"
        "grouping-handler: {type: LOCAL}\nha: {role: primary}\nstore: {format: journal}"
    )
    with pytest.raises(ConfigError, match="replicates the sqlite store format only"):
        parse_config(text, "p.yaml")
