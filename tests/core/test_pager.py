"""The pager (broker/pager.py) over a real core and store: it reads a group's paged messages
back once their writes are on disk, and never spins on a write that is done but whose
callbacks (one drops it from the unwritten writes) have not run yet."""

from __future__ import annotations

import asyncio
import threading
from array import array
from pathlib import Path

from broker.config import NodeConfig, QueueConfig
from broker.core import BrokerCore
from broker.effects import Effects
from broker.message import GROUP_ID_HEADER, Message
from broker.pager import Pager
from broker.store import Store
from broker.store_reads import IndexRun


def test_a_done_write_not_yet_dropped_from_the_unwritten_ones_does_not_stall_the_pager(
    tmp_path: Path,
) -> None:
    """A pager that spins never yields to its loop, so no timeout in that loop could stop
    it: the scenario runs on a loop of its own, in a thread the test waits for."""
    result: list[list[int]] = []
    thread = threading.Thread(target=asyncio.run, args=(_scenario(tmp_path, result),))
    thread.daemon = True  # one that spins is left behind, not waited for
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the pager spun"
    assert result == [[1, 2]]


async def _scenario(tmp_path: Path, result: list[list[int]]) -> None:
    config = NodeConfig.model_validate({"node": {"id": "n1", "data-dir": str(tmp_path)}})
    core = BrokerCore(config)
    core.create_queue("q", "q", QueueConfig())
    store = Store.open(tmp_path / "store.db")
    try:
        stored = [
            Message(i, "q", "q", b"x", {GROUP_ID_HEADER: "a"}, persistent=True, group="a")
            for i in (1, 2)
        ]
        await store.write(stored)
        core.restore_index([IndexRun("q", "a", array("q", [1, 2]), 0)], 3)
        core.subscribe("q", "c", "c", 10, 0)  # a consumer with credit: group a is wanted
        # The write of the newest paged message completed; its done callbacks are queued
        # but have not run, so it is still among the unwritten ones.
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        applied: list[Effects] = []
        pager = Pager(core, store, {2: done}, applied.append)  # type: ignore[arg-type]
        await asyncio.wait_for(pager._read_back("q", 100), 5)
        assert core.queue("q").paged == 0
        result.append([d.message.msg_id for fx in applied for d in fx.deliveries])
    finally:
        await store.close()
