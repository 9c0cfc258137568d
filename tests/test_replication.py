"""ha replication with real processes: a primary's acknowledged writes are on its backup's disk.

The primary (`ha.role: primary`) replicates its message store and its bindings file to the
backup (`ha.role: backup`), which follows it without serving clients: a snapshot for what was
there before it connected, then every write, synchronously once in sync. Failover itself is
not wired yet, so these tests promote the backup's files by hand: a node started on the
backup's data dir as node1 must hold every acknowledged message and binding.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import NodeProcess, get
from ports import reserve_port

from broker.client import Client

QUEUE = "orders"
GROUPS = [f"g{i}" for i in range(8)]
WAIT_S = 30.0


def _node(workdir: Path, node_id: str, cluster: str, **extra: Any) -> NodeProcess:
    workdir.mkdir()
    config = {
        "node": {"id": node_id},
        "listen": {"cluster": cluster},
        "cluster": {"connectors": [], "reconnect-interval": 100},
        "grouping-handler": {"type": "LOCAL"},
        **extra,
    }
    return NodeProcess(workdir, config)


def _ready_detail(node: NodeProcess, *keys: str) -> Any:
    try:
        _, body = get(node.http, "/readyz")
    except OSError:
        return None
    for key in keys:
        body = body.get(key) if isinstance(body, dict) else None
    return body


def _wait(what: str, check: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {WAIT_S} s: {what}")


@pytest.fixture
def pair(tmp_path: Path):  # type: ignore[no-untyped-def]
    primary_cluster = f"127.0.0.1:{reserve_port()}"
    primary = _node(tmp_path / "primary", "node1", primary_cluster, ha={"role": "primary"})
    backup = _node(
        tmp_path / "backup",
        "node1-backup",
        f"127.0.0.1:{reserve_port()}",
        ha={"role": "backup", "primary": primary_cluster},
    )
    yield primary, backup
    backup.kill()
    primary.kill()


async def _send(url: str, start: int, count: int) -> None:
    async with Client(url) as client:
        producers = {g: client.producer(QUEUE, group_id=g) for g in GROUPS}
        for i in range(start, start + count):
            group = GROUPS[i % len(GROUPS)]
            await producers[group].send(f"{group}:{i}")


def _start_backup_in_sync(primary: NodeProcess, backup: NodeProcess) -> None:
    backup.start(wait=False)
    _wait("the backup follows", lambda: _ready_detail(backup, "ha", "replication") == "following")
    _wait(
        "the primary sees its backup in sync",
        lambda: _ready_detail(primary, "ha", "backup_in_sync"),
    )


async def test_a_backup_holds_every_acknowledged_message_and_binding(
    pair: tuple[NodeProcess, NodeProcess], tmp_path: Path
) -> None:
    primary, backup = pair
    primary.start()
    async with Client(primary.url) as client:
        await client.create_queue(QUEUE)
    await _send(primary.url, 0, 200)  # before the backup: it gets these in the snapshot
    _start_backup_in_sync(primary, backup)
    status, body = get(backup.http, "/readyz")
    assert status == 503 and body["role"] == "backup"  # passive: it serves no clients
    await _send(primary.url, 200, 200)  # these go over the stream, each waits for the backup
    primary.kill()  # kill -9
    assert backup.stop(signal.SIGTERM) == 0

    with sqlite3.connect(backup.data_dir / "bindings.db") as conn:
        bound = dict(conn.execute("SELECT grp, node FROM bindings WHERE queue = ?", (QUEUE,)))
    assert bound == {g: "node1" for g in GROUPS}

    promoted = _node(
        tmp_path / "promoted",
        "node1",
        f"127.0.0.1:{reserve_port()}",
        node={"id": "node1", "data-dir": str(backup.data_dir)},
    )
    promoted.start()
    try:
        got: dict[str, list[int]] = {g: [] for g in GROUPS}
        async with Client(promoted.url) as client, client.consumer(QUEUE) as consumer:
            for _ in range(400):
                msg = await consumer.receive(timeout=WAIT_S)
                assert msg is not None, f"only {sum(map(len, got.values()))} of 400 came back"
                group, _, seq = msg.text.partition(":")
                got[group].append(int(seq))
                await msg.ack()
            assert await consumer.receive(timeout=0.5) is None  # and nothing twice
        for group, seqs in got.items():
            assert seqs == sorted(seqs) and len(seqs) == 50, group  # all of it, in order
    finally:
        promoted.stop()


async def test_a_frozen_backup_is_dropped_and_the_primary_carries_on(
    pair: tuple[NodeProcess, NodeProcess],
) -> None:
    primary, backup = pair
    primary.start()
    async with Client(primary.url) as client:
        await client.create_queue(QUEUE)
    _start_backup_in_sync(primary, backup)
    assert backup.proc is not None
    backup.proc.send_signal(signal.SIGSTOP)
    try:
        # The first send waits for the backup, which never answers: past failure-timeout the
        # primary drops it and the send completes.
        await _send(primary.url, 0, 10)
        assert _ready_detail(primary, "ha", "backup_in_sync") is False
        assert "backup lost: carrying on without it" in primary.log()
    finally:
        backup.proc.send_signal(signal.SIGCONT)
    # It comes back, takes a fresh snapshot, and is in sync again.
    _wait("in sync again", lambda: _ready_detail(primary, "ha", "backup_in_sync"))
    await _send(primary.url, 10, 10)
    assert backup.stop(signal.SIGTERM) == 0
    with sqlite3.connect(backup.data_dir / "store.db") as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM messages WHERE queue = ?", (QUEUE,)
        ).fetchone()
    assert count == 20
