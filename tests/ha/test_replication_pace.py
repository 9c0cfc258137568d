"""A snapshot waits for a busy primary: a real primary (`Replicator` over real stores, served
over real gRPC) whose event loop runs late while a real backup (`Follower` on real files)
catches up. The pace itself (cluster/catchup_pace.py) is tested on its own in
test_catchup_pace.py; this is its use by the replication shell."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from replication_pair import QUEUE, Backup, Gate, contents, in_sync, primary, running

from broker.message import Message
from cluster import snapshot_pacing

pytestmark = pytest.mark.slow  # a real primary and backup: seconds

ROWS = 20_000  # twenty frames


async def _late_loop() -> None:
    """Holds the event loop 10 ms at a time: every task of the process runs that late."""
    while True:
        time.sleep(0.01)
        await asyncio.sleep(0.002)


async def test_a_snapshot_waits_while_the_primary_runs_late_and_still_arrives_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot_pacing, "BASELINE_S", 0.0)  # no baseline: the budgets' floor
    async with primary(tmp_path / "primary", Gate(at_once=True)) as p:
        added = [Message(i, QUEUE, QUEUE, b"m" * 10, persistent=True) for i in range(1, ROWS + 1)]
        await p.store.write(added)
        p.next_id = ROWS + 1
        late = asyncio.create_task(_late_loop())
        try:
            async with running(Backup(p.address, tmp_path / "backup")) as b:
                await in_sync(p, b)
                paused = p.replicator.status()["snapshot_paused_s"]
        finally:
            late.cancel()
    assert paused > 0
    assert contents(tmp_path / "backup") == contents(tmp_path / "primary")
