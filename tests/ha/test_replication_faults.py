"""Fault paths of ha replication, with a real primary (`Replicator` over real stores, served
over real gRPC) and a real backup (`Follower` on real files); the failover gate, the layer
above, is the only fake.

- A backup more than `MAX_QUEUED_BYTES` behind is dropped: what was queued for it is freed, its
  stream ends although it reads nothing, the writes that waited for it are acknowledged only
  once the gate allows writes alone, and the backup comes back through a fresh snapshot.
- Backups that go away in the middle of a snapshot leave the primary running, with no read of
  its store left pinned, and a big snapshot is received in one go.
- A backup killed (-9, in a process of its own) at each step of swapping a received snapshot in
  restarts on one whole copy, the old or the new, never the store of one with the bindings of
  the other; it reports nothing in sync until a fresh snapshot is in, and then holds exactly
  what the primary holds.

Run as a script (`python tests/ha/test_replication_faults.py follow ...`) it is that backup
process, armed to kill itself at a step.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import REPO, TESTS
from disk_images import disks
from grpc import aio
from replication_pair import (
    BIG,
    EPOCH,
    LIMIT,
    MAX_WRITES,
    QUEUE,
    WAIT_S,
    Backup,
    Gate,
    Primary,
    contents,
    in_sync,
    leftovers,
    primary,
    running,
)
from waiting import until

from broker import sqlite_file
from broker.message import Message
from broker.store_files import STORE_FILE
from cluster import replica, replication
from cluster.replica import SWAP_MARKER, Follower
from pinmq_pb import cluster_pb2 as pb
from pinmq_pb import cluster_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow  # real primaries and backups through faults: tens of seconds each

# ---- 1. a backup too far behind


class Paced:
    """The backup's reading of its stream, which the test can hold (`flowing.clear()`): the
    frames then stay in the transport, and once its window is full, on the primary, as with a
    backup too slow to keep up. Keepalive pings are still answered: only the reading stops."""

    def __init__(self) -> None:
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.streams = 0

    def stub(self, channel: aio.Channel) -> Any:
        real = pb_grpc.ClusterStub(channel)
        paced = self

        class Stub:
            def Replicate(self) -> _PacedCall:
                paced.streams += 1
                return _PacedCall(real.Replicate(), paced.flowing)

        return Stub()


class _PacedCall:
    def __init__(self, call: Any, flowing: asyncio.Event) -> None:
        self._frames = call.__aiter__()
        self._flowing = flowing
        self.write = call.write  # the backup's reports go out unhindered

    def __aiter__(self) -> _PacedCall:
        return self

    async def __anext__(self) -> pb.ReplicationFrame:
        await self._flowing.wait()
        return await self._frames.__anext__()


async def test_a_backup_too_far_behind_is_dropped_and_catches_up_from_a_fresh_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_limit = replication.MAX_QUEUED_BYTES
    monkeypatch.setattr(replication, "MAX_QUEUED_BYTES", LIMIT)
    paced = Paced()
    monkeypatch.setattr(replica, "pb_grpc", SimpleNamespace(ClusterStub=paced.stub))
    gate = Gate(at_once=False)
    async with primary(tmp_path / "primary", gate) as p:
        await p.send(20)
        await p.bind("g1", "g2")
        b = Backup(p.address, tmp_path / "backup")
        async with running(b):
            await in_sync(p, b)
            assert gate.synced == 1 and b.synced == [EPOCH]

            # The backup stops reading. One more write waits for it and is confirmed: its
            # frame is the last the backup reads, the writes after it pile up on the primary.
            paced.flowing.clear()
            await asyncio.wait_for(p.write(), WAIT_S)
            dropped = p.replicator.backup
            assert dropped is not None and dropped.lost is None
            # Writes go on to the transport until its window is full and a frame's write
            # blocks; then they pile up on the primary until it drops the backup.
            writes: list[asyncio.Future[None]] = []
            while len(writes) < MAX_WRITES:
                writes.append(asyncio.ensure_future(p.write(b"x" * BIG)))
                if not await drained(dropped):
                    break
            while gate.lost == 0 and len(writes) < MAX_WRITES:
                writes.append(asyncio.ensure_future(p.write(b"x" * BIG)))
                await asyncio.sleep(0)
            assert gate.lost == 1, f"{len(writes)} writes of {BIG} bytes did not drop it"
            assert "behind" in str(dropped.lost)

            # Dropped: reported out of sync, what was queued for it freed, and its stream ends
            # although it reads nothing.
            assert not gate.backup_in_sync
            assert (dropped.queued_bytes, len(dropped.queue)) == (0, 0)
            await until("its stream ended", lambda: p.replicator.backup is None)
            assert p.replicator.status() == {"backup": None, "backup_in_sync": False}

            # The writes it never confirmed are on the primary's disk, but none is acknowledged
            # until the voters know the backup is out of sync: it could be elected before that.
            total = p.next_id - 1
            await until("every write on the primary's disk", lambda: stored(p) == total)
            for _ in range(10):
                await asyncio.sleep(0.01)  # let whatever completes them, wrongly, run
            assert not any(w.done() for w in writes)
            gate.tell_voters()
            await asyncio.wait_for(asyncio.gather(*writes), WAIT_S)
            await asyncio.wait_for(p.send(5), WAIT_S)  # alone, at once
            await p.forget(1, 2, 3)
            await p.unbind("g1")
            await p.bind("g3")

            # It reads again: what was on the way, then that it was dropped (out of sync on
            # its side too), then a fresh snapshot on a new stream.
            paced.flowing.set()
            await in_sync(p, b)
            assert paced.streams == 2 and b.broken >= 1
            assert gate.synced == 2 and b.synced == [EPOCH, EPOCH]
            assert b.follower.status()["replication"] == "following"
            await asyncio.wait_for(p.send(5), WAIT_S)  # waits for the backup again
            # One write bigger than gRPC's default 4 MiB message (max-message-size is 10 MiB),
            # under the real limit.
            monkeypatch.setattr(replication, "MAX_QUEUED_BYTES", real_limit)
            await asyncio.wait_for(p.write(b"y" * (5 << 20)), WAIT_S)
            assert gate.lost == 1
            assert b.follower.durable == p.replicator.seq
            assert contents(b.follower.paths["store"].parent) == contents(p.data_dir)


async def test_a_backup_whose_disk_fills_leaves_at_once_and_catches_up_once_it_has_room(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The backup's data on a small disk of its own (tests/disk_images.py), filled while it
    follows: the first write it cannot hold ends its stream there and then, so the primary
    drops it at once (not after its failure-timeout, here ten minutes, with its writes
    waiting), and the writes behind the failed one leave no error unretrieved. Freed, the
    backup catches up from a fresh snapshot and holds what the primary holds."""
    gate = Gate(at_once=True)
    with disks(tmp_path, ("backup",), 16) as made:
        disk = made["backup"]
        async with primary(tmp_path / "primary", gate) as p:
            await p.send(20)
            b = Backup(p.address, disk.mount)
            async with running(b):
                await in_sync(p, b)
                disk.fill()
                # Writes that wait for the backup until it fails one, then for nothing.
                await asyncio.wait_for(p.send(20, b"x" * 4096), WAIT_S)
                assert gate.lost == 1 and b.broken >= 1
                assert not gate.backup_in_sync
                disk.free()
                await in_sync(p, b)
                assert gate.synced == 2
                assert contents(disk.mount) == contents(p.data_dir)
        gc.collect()  # a future whose error nobody took logs it when collected
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text


async def drained(backup: replication._Backup) -> bool:
    """Whether the primary hands what is queued for `backup` on to the transport within
    half a second (once the transport's window is full, it does not)."""
    for _ in range(50):
        await asyncio.sleep(0.01)
        if not backup.queue:
            return True
    return False


def stored(p: Primary) -> int:
    conn = sqlite_file.read_only(p.data_dir / STORE_FILE)
    try:
        return conn.execute("SELECT count(*) FROM messages").fetchone()[0]
    finally:
        conn.close()


async def test_a_backup_gone_in_the_middle_of_a_snapshot_leaves_no_read_pinned(
    tmp_path: Path,
) -> None:
    """The primary reads a snapshot on threads: a stream that ends meanwhile must neither close
    the read under a thread (SQLite crashes the process) nor leave it pinned (the WAL could
    never be checkpointed again)."""
    gate = Gate(at_once=True)
    async with primary(tmp_path / "primary", gate) as p:
        added = [Message(i, QUEUE, QUEUE, b"m" * 10, persistent=True) for i in range(1, ROWS + 1)]
        await p.store.write(added)
        p.next_id = len(added) + 1
        for _ in range(ROUNDS):
            async with aio.insecure_channel(p.address, options=replica.CHANNEL_OPTIONS) as channel:
                call = pb_grpc.ClusterStub(channel).Replicate(hello())
                async for frame in call:
                    if frame.WhichOneof("frame") == "rows":
                        break  # gone, with most of the snapshot still to read
                call.cancel()
            await until("the primary let it go", lambda: p.replicator.backup is None)
        await p.send(5)  # past every pin: a pin left behind keeps these in the WAL
        await until("no read pinned on the primary's store", lambda: checkpointed(p))
        async with running(Backup(p.address, tmp_path / "backup")) as b:
            await in_sync(p, b)
            assert b.broken == 0  # a big snapshot, received in one go
            assert contents(tmp_path / "backup") == contents(p.data_dir)


ROUNDS = 20  # streams that end in the middle of a snapshot
ROWS = 200_000  # reading them takes long enough that the streams end while a read runs


async def hello() -> AsyncIterator[pb.ReplicaReport]:
    yield pb.ReplicaReport(hello=pb.ReplicaHello(node_id="node1-backup"))
    await asyncio.Event().wait()


def checkpointed(p: Primary) -> bool:
    """Whether the whole WAL of the primary's store goes into the file: no read holds it."""
    conn = sqlite3.connect(p.data_dir / STORE_FILE)
    try:
        busy, log, done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.close()
    return busy == 0 and log == done


# ---- 2. a backup killed while it swaps a snapshot in

# Where the backup process kills itself while installing a snapshot (`cluster.replica`):
# the snapshot files whole and durable, the swap not begun; begun, nothing swapped yet; the
# store swapped, the bindings not; both swapped, the swap not yet marked done.
POINTS = ("sealed", "marked", "between", "swapped")


def arm(point: str) -> None:
    """In the backup process: SIGKILL itself when installing a snapshot reaches `point`."""

    def die(*_: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    put_in_place = replica._put_in_place
    calls = 0

    def put(path: Path) -> None:
        nonlocal calls
        calls += 1
        if (point, calls) in (("marked", 1), ("between", 2)):
            die()
        put_in_place(path)

    if point == "sealed":
        replica._mark = die  # type: ignore[assignment]
    elif point == "swapped":
        replica._unmark = die  # type: ignore[assignment]
    else:
        replica._put_in_place = put  # type: ignore[assignment]


async def follow_until_killed(address: str, data_dir: Path, point: str) -> None:
    arm(point)
    follower = Follower(
        "node1-backup", address, data_dir, retry_s=0.05, warn_after_s=WAIT_S,
        on_synced=lambda epoch: print(f"reported in sync at epoch {epoch}", flush=True),
    )  # fmt: skip
    await follower.run()


@pytest.mark.parametrize("point", POINTS)
async def test_a_backup_killed_while_swapping_a_snapshot_in_restarts_on_one_whole_copy(
    tmp_path: Path, point: str
) -> None:
    gate = Gate(at_once=True)
    backup_dir = tmp_path / "backup"
    async with primary(tmp_path / "primary", gate) as p:
        # The backup holds a whole copy (old): messages 1-20 and groups g1-g5.
        await p.send(20)
        await p.bind("g1", "g2", "g3", "g4", "g5")
        async with running(Backup(p.address, backup_dir)) as first:
            await in_sync(p, first)
        old = contents(backup_dir)
        assert old == contents(p.data_dir)

        # The primary goes on alone; both files change: the new copy differs in each.
        await p.send(10)
        await p.forget(1, 2, 3, 4, 5)
        await p.bind("g6", "g7")
        await p.unbind("g1", "g2")
        new = contents(p.data_dir)
        for name in new:
            if name.endswith((":messages", ":bindings")):
                assert new[name] != old[name], name

        # The backup comes back, receives the new copy, and dies at `point` of swapping it in.
        log_path = tmp_path / "backup.log"
        with open(log_path, "w") as log_file:
            proc = subprocess.Popen(
                [sys.executable, __file__, "follow", p.address, str(backup_dir), point],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO), str(TESTS)))},
            )
            try:
                code = await asyncio.to_thread(proc.wait, WAIT_S)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        log = log_path.read_text()
        assert code == -signal.SIGKILL, log
        assert "in sync" not in log and "snapshot installed" not in log, log
        assert (backup_dir / SWAP_MARKER).exists() == (point != "sealed")

        # Restarted on the same files: before it hears from the primary they hold one whole
        # copy (the old one if the swap had not begun, else the new one), nothing half done
        # is left, and it reports nothing in sync.
        again = Backup(p.address, backup_dir)
        assert leftovers(backup_dir) == []
        found = contents(backup_dir)
        assert found in (old, new), "the store of one copy with the bindings of the other"
        if point == "sealed":
            assert found == old  # the swap had not begun: the old copy is untouched
        assert again.follower.status()["replication"] == "connecting"

        # More writes meanwhile; then it catches up from a fresh snapshot, and follows.
        await p.send(5)
        await p.unbind("g3")
        async with running(again):
            await in_sync(p, again)
            assert again.synced == [EPOCH]
            await asyncio.wait_for(p.send(5), WAIT_S)  # waits for the backup
            await p.bind("g8")
            assert again.follower.durable == p.replicator.seq
            assert contents(backup_dir) == contents(p.data_dir)
        assert leftovers(backup_dir) == []


if __name__ == "__main__":
    _, command, address, data_dir, point = sys.argv
    assert command == "follow"
    asyncio.run(follow_until_killed(address, Path(data_dir), point))
