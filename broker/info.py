"""What a node tells about its queues, groups, consumers and cluster: one definition of each.

The core fills these records, the gRPC shell turns them into protobuf messages
(`pinmq/grpc_admin.py`), and the Python client turns those back into the same records
(`broker/client/convert.py`), so a field means the same at every hop; `/metrics` reads a
queue's `QueueCounts` (`pinmq/metrics.py`). Times are wall-clock nanoseconds (0: never);
`last_use` reads one as a datetime. A leaf: it imports nothing of pinmq, so the client can
share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

NS_PER_MS = 1_000_000


def from_ns(ns: int) -> datetime | None:
    return datetime.fromtimestamp(ns / 1e9, UTC) if ns else None


@dataclass(slots=True, frozen=True)
class QueueInfo:
    name: str
    address: str
    depth: int
    consumer_count: int
    settings: dict[str, Any]  # the queue's settings, keyed as in the node config


@dataclass(slots=True, frozen=True)
class QueueCounts:
    """A queue's figures that it counts as messages move, so reading them walks nothing."""

    pending: int  # waiting for delivery, paged ones included
    in_flight: int  # delivered, not yet settled
    paged: int  # on disk only
    consumers: int
    groups: int  # in the group table: with messages (waiting, paged or out), owned or held
    owned: int  # groups pinned to a consumer
    unowned_waiting: int  # groups with messages waiting (or paged) and no owner, held or not
    held: int  # groups held while the node confirms where they are bound
    memory_bytes: int  # what its messages in memory count for (pending and in flight)
    in_flight_bytes: int  # of which delivered, not yet settled
    oldest_ns: int  # when its oldest message in memory, waiting or out, was enqueued; 0: none


@dataclass(slots=True, frozen=True)
class LaggingGroup:
    """A group among a queue's most lagging ones (broker/lagging.py): its backlog, and how long
    its oldest waiting message has waited (`oldest_ns` 0: that message is paged, on disk)."""

    group: str
    backlog: int  # messages waiting, in memory or paged
    oldest_ns: int  # when its oldest message in memory was enqueued
    owner_name: str | None
    held: bool


@dataclass(slots=True, frozen=True)
class GroupInfo:
    """A group in one queue's group table: who owns it, what it holds, when it was used."""

    group: str
    owner: str | None  # consumer id
    owner_name: str | None
    pending: int  # waiting for delivery, paged ones included
    outstanding: int  # delivered, not yet settled
    last_use_ns: int
    oldest_pending_ns: int = 0  # its oldest message waiting in memory (0: none, or paged only)

    @property
    def last_use(self) -> datetime | None:
        return from_ns(self.last_use_ns)

    @property
    def oldest_pending(self) -> datetime | None:
        return from_ns(self.oldest_pending_ns)


@dataclass(slots=True, frozen=True)
class ConsumerInfo:
    """A consumer of a queue; `stalled_ms` > 0: it settled nothing for that long while it
    held messages, so it gets no new group (slow-consumer-threshold)."""

    consumer_id: str
    name: str
    prefetch: int
    unacked: int
    groups: int
    stalled_ms: int
    delivered: int  # since it subscribed, redeliveries included
    acked: int


@dataclass(slots=True, frozen=True)
class ClusterGroupInfo:
    """A group on one queue instance, `queue@node`: its binding and its table entry there."""

    group: str
    queue: str
    node: str
    bound: bool  # the LOCAL grouping handler binds (group, queue) to this node
    owner: str | None = None
    owner_name: str | None = None
    pending: int = 0
    outstanding: int = 0
    last_use_ns: int = 0
    oldest_pending_ns: int = 0  # as GroupInfo's

    @property
    def last_use(self) -> datetime | None:
        return from_ns(self.last_use_ns)

    @property
    def oldest_pending(self) -> datetime | None:
        return from_ns(self.oldest_pending_ns)


def table_fields(g: GroupInfo | ClusterGroupInfo) -> dict[str, Any]:
    """A group-table entry's fields as the protobuf messages that carry one name them
    (`GroupInfo`, `ClusterGroupInfo`, the cluster's `GroupRow`)."""
    return {
        "owner_consumer_id": g.owner or "",
        "owner_name": g.owner_name or "",
        "pending": g.pending,
        "outstanding": g.outstanding,
        "last_use_unix_ms": g.last_use_ns // NS_PER_MS,
        "oldest_pending_unix_ms": g.oldest_pending_ns // NS_PER_MS,
    }


def from_table_fields(m: Any) -> dict[str, Any]:
    """The record's fields of a group-table entry from such a protobuf message."""
    return {
        "owner": m.owner_consumer_id or None,
        "owner_name": m.owner_name or None,
        "pending": m.pending,
        "outstanding": m.outstanding,
        "last_use_ns": m.last_use_unix_ms * NS_PER_MS,
        "oldest_pending_ns": m.oldest_pending_unix_ms * NS_PER_MS,
    }


@dataclass(slots=True, frozen=True)
class NodeStatus:
    """One node as the node asked sees it: linked or not, its handler, consumers per queue."""

    node_id: str
    connected: bool
    handler: str  # "LOCAL", "REMOTE" or ""
    consumers: dict[str, int]


@dataclass(slots=True, frozen=True)
class HaPairStatus:
    """An ha pair: which process is active (the arbiter, for the LOCAL node), its backup."""

    logical: str  # the node id the active process answers as
    epoch: int
    active: str  # the active process's own node id
    backup: str
    backup_in_sync: bool
    from_active: bool  # told by the active process itself, else by its last heartbeat
