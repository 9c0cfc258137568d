"""How far behind a backup is, in records and bytes, as the primary's replication reports it
(`Replicator.status`, read by `GET /metrics`): it grows with each write shipped and falls as
the backup confirms them, without a walk of what is queued."""

from __future__ import annotations

from cluster.replication import _Backup
from pinmq_pb import cluster_pb2 as pb


def op(seq: int, size: int) -> pb.ReplicatedOp:
    return pb.ReplicatedOp(seq=seq, file="store", payload=b"x" * size)


async def test_bytes_behind_follow_what_the_backup_confirmed() -> None:
    backup = _Backup("node1-backup", after=0, timeout_s=5.0)
    for seq, size in ((1, 100), (2, 20), (3, 3)):
        backup.ship(op(seq, size))
    assert backup.behind_bytes == 123
    backup.take()  # sent: still unconfirmed, still behind
    assert backup.behind_bytes == 123
    backup.confirmed(2)
    assert backup.behind_bytes == 3
    backup.confirmed(1)  # an older report changes nothing
    assert backup.behind_bytes == 3
    backup.confirmed(3)
    assert backup.behind_bytes == 0
    backup.ship(op(4, 7))
    assert backup.behind_bytes == 7


class Gate:
    """Counts what the backup tells the failover shell; writes are never admitted alone."""

    epoch = 1

    def __init__(self) -> None:
        self.synced = 0

    def backup_synced(self) -> None:
        self.synced += 1


async def test_a_snapshot_at_0_counts_only_once_the_backup_confirms_it() -> None:
    """A primary that starts afresh snapshots at sequence 0. Writes that come before the backup
    has installed that snapshot neither wait for it nor make it in sync; once it confirms, the
    next write waits for it and its confirmation tells the gate, once."""
    gate = Gate()
    backup = _Backup("node1-backup", after=0, timeout_s=5.0, gate=gate)  # type: ignore[arg-type]
    assert backup.ship(op(1, 10)) is None  # the snapshot is still on its way
    assert not backup.in_sync and gate.synced == 0
    backup.confirmed(0)  # installed: it holds everything up to 0, but 1 is not yet confirmed
    assert not backup.in_sync and gate.synced == 0
    waits = backup.ship(op(2, 10))
    assert waits is not None and not waits.done()
    backup.confirmed(2)
    assert waits.done() and backup.in_sync and gate.synced == 1
    backup.confirmed(3)
    assert gate.synced == 1
