"""Duplicate detection (`_AMQ_DUPL_ID`): the pure id cache, the send path that drops what a
client sends again, and the engine that stores the ids with their messages and reads them back.
The clustered send path's screening is in tests/cluster/test_cluster_send.py; real nodes over gRPC
and STOMP, and a kill -9, in tests/node/test_duplicates_node.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from engine_harness import RecordingEngine, send_now
from queue_harness import core_from

from broker.config import NodeConfig
from broker.core import BrokerCore, UnknownAddress
from broker.duplicates import MAX_ID_CHARS, IdCache, id_key
from broker.effects import Effects
from broker.engine import Engine
from broker.message import DUPLICATE_ID_HEADER, Outgoing
from broker.sending import LocalSendPath
from broker.store_files import open_store

DUP = DUPLICATE_ID_HEADER


# ---- the pure cache -------------------------------------------------------------------------


def test_the_oldest_id_goes_first_and_each_address_has_its_own_ids() -> None:
    cache = IdCache(2)
    assert cache.add("a", "x", 1, True) == [("a", "x", 1)]
    assert cache.add("a", "y", 2, True) == [("a", "y", 2)]
    assert cache.add("b", "x", 3, True) == [("b", "x", 3)]  # another address: room of its own
    # A third id on `a` evicts its oldest, and the store is told to forget it.
    assert cache.add("a", "z", 4, True) == [("a", "z", 4), ("a", "x", None)]
    assert cache.screen([("a", "x"), ("a", "y"), ("a", "z"), ("b", "x"), ("b", "y")]) == [
        False,
        True,
        True,
        True,
        False,
    ]
    assert (cache.original("a", "y"), cache.original("a", "x"), cache.original("b", "x")) == (
        2,
        None,
        3,
    )
    assert len(cache) == 3
    # An evicted id is accepted again, and is then the newest: `y` goes before it.
    assert cache.add("a", "x", 5, True) == [("a", "x", 5), ("a", "y", None)]
    assert cache.screen([("a", "x"), ("a", "y")]) == [True, False]


def test_a_later_message_of_the_batch_with_the_same_id_is_a_duplicate() -> None:
    cache = IdCache(10)
    cache.add("a", "old", 1, True)
    batch: list[tuple[str, str | None]] = [
        ("a", "n"),
        ("b", "n"),  # same id, other address: not a duplicate
        ("a", "n"),
        ("a", "old"),
        ("a", None),
        ("a", ""),  # an empty id is no id
        ("a", None),
        ("a", ""),
    ]
    assert cache.screen(batch) == [False, False, True, True, False, False, False, False]
    assert cache.screen(batch) == cache.screen(batch)  # screening changes nothing
    assert cache.original("a", "n") is None


def test_a_batch_repeating_an_id_drops_the_repeat_even_with_room_for_one_id() -> None:
    cache = IdCache(1)
    assert cache.screen([("a", "x"), ("a", "y"), ("a", "x")]) == [False, False, True]


def test_size_zero_turns_detection_off() -> None:
    cache = IdCache(0)
    assert cache.add("a", "x", 1, True) == []
    assert cache.screen([("a", "x"), ("a", "x")]) == [False, False]
    assert cache.original("a", "x") is None and len(cache) == 0
    # What an earlier run stored is forgotten, so the table empties.
    assert cache.load([("a", "x", 1), ("b", "y", 2)]) == [("a", "x", None), ("b", "y", None)]
    with pytest.raises(ValueError):
        IdCache(-1)


def test_only_ids_of_persistent_messages_reach_the_store() -> None:
    cache = IdCache(2)
    assert cache.add("a", "mem", 1, False) == []  # kept in memory only
    assert cache.screen([("a", "mem")]) == [True]
    assert cache.add("a", "disk", 2, True) == [("a", "disk", 2)]
    # Evicting an id the store never had costs the store nothing; evicting a stored one does.
    assert cache.add("a", "next", 3, True) == [("a", "next", 3)]
    assert cache.add("a", "last", 4, False) == [("a", "disk", None)]


def test_loading_keeps_the_newest_ids_and_forgets_what_no_longer_fits() -> None:
    cache = IdCache(2)
    stored = [("a", "1", 1), ("b", "1", 2), ("a", "2", 3), ("a", "3", 4)]
    assert cache.load(stored) == [("a", "1", None)]
    assert cache.screen([("a", "1"), ("a", "2"), ("a", "3"), ("b", "1")]) == [
        False,
        True,
        True,
        True,
    ]
    assert cache.original("a", "3") == 4


def test_a_long_id_is_kept_as_a_short_digest() -> None:
    long_a, long_b = "a" * 10_000, "a" * 9_999 + "b"
    assert len(id_key(long_a)) <= MAX_ID_CHARS and id_key(long_a) != id_key(long_b)
    assert id_key("short") == "short" and id_key(long_a) == id_key(long_a)
    cache = IdCache(5)
    assert cache.add("a", long_a, 7, True) == [("a", id_key(long_a), 7)]
    assert cache.screen([("a", long_a), ("a", long_b)]) == [True, False]
    assert cache.original("a", long_a) == 7
    # Read back from the store, the digest is not hashed again.
    reloaded = IdCache(5)
    reloaded.load([("a", id_key(long_a), 7)])
    assert reloaded.screen([("a", long_a)]) == [True]


# ---- the core and the send path ------------------------------------------------------------


def out(address: str, body: str, dup: str | None = None, persistent: bool = True) -> Outgoing:
    return Outgoing(address, body.encode(), {DUP: dup} if dup is not None else {}, persistent)


def bodies(core: BrokerCore, queue: str) -> list[bytes]:
    return [m.body for m in core.queue(queue).held()]


def sent(engine: RecordingEngine, batch: list[Outgoing], now: int) -> tuple[list[int], Effects]:
    """A client's batch through a standalone node's send path: (msg ids, Effects)."""
    result = send_now(engine, LocalSendPath(), batch, now)
    assert result is not None
    return result


def test_a_message_sent_again_is_answered_with_the_original_id_and_dropped() -> None:
    core = core_from()
    engine = RecordingEngine(core)
    ids, fx = sent(engine, [out("q", "first", "d1"), out("q", "plain")], 1)
    assert fx.duplicate_ids == [("q", "d1", ids[0])]  # stored with the messages it came with
    assert [m.msg_id for m in fx.added] == ids and fx.duplicates == []

    again, fx = sent(engine, [out("q", "resent", "d1"), out("q", "plain")], 2)
    assert again[0] == ids[0] and again[1] not in ids  # no id: a new message each time
    assert [m.body for m in fx.added] == [b"plain"]
    assert fx.duplicates == [("q", "d1", ids[0])] and fx.duplicate_ids == []
    assert bodies(core, "q") == [b"first", b"plain", b"plain"]
    assert core.duplicates_dropped == 1


def test_within_one_batch_the_later_copy_is_dropped() -> None:
    core = core_from()
    ids, fx = sent(
        RecordingEngine(core),
        [out("q", "a", "x"), out("q", "b", "y"), out("q", "a again", "x"), out("r", "a", "x")],
        1,
    )
    assert ids[2] == ids[0] and len(set(ids)) == 3
    assert [(m.queue, m.body) for m in fx.added] == [("q", b"a"), ("q", b"b"), ("r", b"a")]
    assert fx.duplicates == [("q", "x", ids[0])]
    assert core.duplicates_dropped == 1


def test_a_batch_of_duplicates_only_changes_nothing_but_the_count() -> None:
    core = core_from()
    engine = RecordingEngine(core)
    (first,), _ = sent(engine, [out("q", "a", "x")], 1)
    ids, fx = sent(engine, [out("q", "a", "x"), out("q", "a", "x")], 2)
    assert ids == [first, first]
    assert not (fx.added or fx.duplicate_ids or fx.queues_created)
    assert len(fx.duplicates) == 2 and bodies(core, "q") == [b"a"]


def test_non_persistent_ids_are_remembered_but_not_stored() -> None:
    engine = RecordingEngine(core_from())
    (first,), fx = sent(engine, [out("q", "a", "mem", persistent=False)], 1)
    assert fx.duplicate_ids == []
    ids, fx = sent(engine, [out("q", "a", "mem", persistent=False)], 2)
    assert ids == [first] and fx.added == [] and len(fx.duplicates) == 1


def test_a_refused_batch_remembers_none_of_its_ids() -> None:
    core = core_from(
        "address-settings:\n"
        "  'noauto.#': {auto-create-queues: false, auto-create-addresses: false}\n"
    )
    engine = RecordingEngine(core)
    with pytest.raises(UnknownAddress):
        sent(engine, [out("q", "a", "x"), out("noauto.q", "b", "y")], 1)
    _, fx = sent(engine, [out("q", "a", "x")], 2)
    assert [m.body for m in fx.added] == [b"a"] and fx.duplicates == []


def test_detection_off_enqueues_every_copy() -> None:
    core = core_from("limits: {id-cache-size: 0}\n")
    ids, fx = sent(RecordingEngine(core), [out("q", "a", "x"), out("q", "a", "x")], 1)
    assert ids[0] != ids[1] and len(fx.added) == 2 and fx.duplicate_ids == []
    assert core.duplicates_dropped == 0


# ---- the engine: ids stored with their messages, read back at start ------------------------


def config(tmp_path: Path, size: int = 20_000) -> NodeConfig:
    return NodeConfig.model_validate(
        {"node": {"id": "n1", "data-dir": str(tmp_path)}, "limits": {"id-cache-size": size}}
    )


async def send(engine: Engine, *batch: Outgoing) -> list[int]:
    with engine.unit() as unit:
        ids = LocalSendPath().send_now(list(batch), unit, 1)
    if unit.write is not None:
        await unit.write
    return ids


def held(engine: Engine, queue: str) -> list[bytes]:
    return [m.body for m in engine._core.queue(queue).held()]


async def stored_ids(tmp_path: Path) -> list[tuple[str, str, int]]:
    """What the node's store holds, whichever its format (`store.format: auto`)."""
    store = open_store(config(tmp_path), None)
    try:
        return store.load_ids()
    finally:
        await store.close()


async def test_ids_are_stored_with_their_messages_and_read_back_at_start(tmp_path: Path) -> None:
    engine = Engine(config(tmp_path))
    engine.open()
    try:
        ids = await send(engine, out("q", "a", "x"), out("q", "b", "mem", persistent=False))
        assert await send(engine, out("q", "a", "x")) == ids[:1]
        assert engine.resources()["duplicates_dropped"] == 1
        assert engine.resources()["duplicate_ids"] == 2
    finally:
        await engine.close()
    assert await stored_ids(tmp_path) == [("q", "x", ids[0])]  # the non-persistent one: memory only

    engine = Engine(config(tmp_path))
    engine.open()
    try:
        again = await send(engine, out("q", "a", "x"), out("q", "b", "mem", persistent=False))
        assert again[0] == ids[0]  # the id survived the restart: dropped, the original's id
        # The non-persistent id did not survive (nor did its message): "b" is taken again.
        assert held(engine, "q") == [b"a", b"b"]
        assert engine.resources()["duplicates_dropped"] == 1
    finally:
        await engine.close()


async def test_a_lowered_cache_size_shrinks_the_stored_ids_at_start(tmp_path: Path) -> None:
    engine = Engine(config(tmp_path))
    engine.open()
    try:
        await send(engine, *(out("q", str(i), f"id-{i}") for i in range(5)))
    finally:
        await engine.close()
    assert [row[1] for row in await stored_ids(tmp_path)] == [f"id-{i}" for i in range(5)]

    engine = Engine(config(tmp_path, size=2))
    engine.open()
    try:
        fresh = await send(engine, out("q", "again", "id-2"), out("q", "again", "id-4"))
        assert len(held(engine, "q")) == 6  # id-2 was forgotten, id-4 was not
        await send(engine, out("q", "one more", "id-5"))  # a write after the trim's
    finally:
        await engine.close()
    assert fresh[0] not in range(1, 6) and fresh[1] in range(1, 6)
    assert [row[1] for row in await stored_ids(tmp_path)] == ["id-2", "id-5"]


async def test_a_duplicate_is_confirmed_only_once_its_original_is_on_disk(tmp_path: Path) -> None:
    engine = Engine(config(tmp_path))
    engine.open()
    try:
        path = LocalSendPath()

        def commit(now: int) -> asyncio.Future[None] | None:
            with engine.unit() as unit:
                path.send_now([out("q", "a", "x")], unit, now)
            return unit.write

        original = commit(1)
        duplicate = commit(2)  # nothing of its own to write, yet it waits
        assert held(engine, "q") == [b"a"]
        assert original is not None and duplicate is not None and not duplicate.done()
        await duplicate
        assert original.done()
        # Once the original is on disk, a duplicate has nothing to wait for.
        assert commit(3) is None
    finally:
        await engine.close()
