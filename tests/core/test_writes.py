"""What the engine's store writes (broker/writes.py) promise the node: a write that cannot
finish fails the node, loudly, rather than leave the deliveries behind it waiting in silence;
a caller that gives up never takes the write with it. A real store; the ha backup's
confirmation is its tap, held by the test."""

from __future__ import annotations

import asyncio
from pathlib import Path

from store_harness import let_tasks_run, msg

from broker.config import NodeConfig
from broker.effects import Delivery, Effects
from broker.store import Store
from broker.store_reads import StoreError
from broker.writes import Writes, shielded


def _writes(store: Store, tmp_path: Path, failures: list[BaseException]) -> Writes:
    config = NodeConfig.model_validate({"node": {"id": "n1", "data-dir": str(tmp_path)}})
    return Writes(store, config, lambda _queue: True, failures.append)


def _held(store: Store) -> asyncio.Future[None]:
    """The backup's confirmation of the next write, which only the test gives."""
    confirmation = asyncio.get_running_loop().create_future()
    store.tap = lambda _record: confirmation
    return confirmation


async def test_a_cancelled_write_fails_the_node(store: Store, tmp_path: Path) -> None:
    failures: list[BaseException] = []
    writes = _writes(store, tmp_path, failures)
    _held(store)
    added = msg(1)
    write, _ = writes.of(Effects(added=[added]), None)
    assert write is not None
    await let_tasks_run()
    assert writes.gates([Delivery(1, "c", added, True)]) == {write}  # its delivery waits

    write.cancel()  # whether the message is on disk is now unknown
    await let_tasks_run()

    assert len(failures) == 1
    assert isinstance(failures[0], StoreError)
    assert "a store write was cancelled" in str(failures[0])


async def test_a_write_the_store_refuses_fails_the_node(store: Store, tmp_path: Path) -> None:
    failures: list[BaseException] = []
    writes = _writes(store, tmp_path, failures)
    await store.close()
    write, _ = writes.of(Effects(added=[msg(1)]), None)
    assert write is not None
    await asyncio.gather(write, return_exceptions=True)
    assert len(failures) == 1
    assert "store is closed" in str(failures[0])


async def test_a_caller_that_gives_up_leaves_the_write_running(
    store: Store, tmp_path: Path
) -> None:
    failures: list[BaseException] = []
    writes = _writes(store, tmp_path, failures)
    confirmation = _held(store)
    added = msg(1)
    write, _ = writes.of(Effects(added=[added]), None)
    assert write is not None
    caller = asyncio.ensure_future(shielded(write))
    await let_tasks_run()

    caller.cancel()  # the client went away mid-send
    await asyncio.gather(caller, return_exceptions=True)
    assert not write.done()

    confirmation.set_result(None)
    await write
    assert failures == []
    assert writes.gates([Delivery(1, "c", added, True)]) == set()  # on disk: nothing to wait for
    assert [m.msg_id for m in store.load_messages()] == [1]
