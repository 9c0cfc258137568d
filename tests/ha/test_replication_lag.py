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
