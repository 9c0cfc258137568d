"""What the admin calls answer: queues, groups, the cluster's groups and status."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


@dataclass(slots=True, frozen=True)
class QueueInfo:
    name: str
    address: str
    depth: int
    consumer_count: int
    settings: dict[str, Any]


@dataclass(slots=True, frozen=True)
class GroupInfo:
    group: str
    owner: str | None
    owner_name: str | None
    pending: int
    outstanding: int
    last_use: datetime | None


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


@dataclass(slots=True, frozen=True)
class ClusterGroupInfo:
    """A group on one queue instance (`queue@node`), as `Client.cluster_groups` lists it."""

    group: str
    queue: str
    node: str
    bound: bool  # the LOCAL grouping handler binds (group, queue) to this node
    owner: str | None
    owner_name: str | None
    pending: int
    outstanding: int
    last_use: datetime | None


@dataclass(slots=True, frozen=True)
class ClusterGroups:
    groups: list[ClusterGroupInfo]
    unreachable: list[str]  # nodes (or the grouping handler) that did not answer
    problems: list[str]


@dataclass(slots=True, frozen=True)
class HaPairStatus:
    """The LOCAL node's pair: which process is the active arbiter, and its backup."""

    logical: str  # the node id the active process answers as
    epoch: int
    active: str  # the active process's own node id
    backup: str
    backup_in_sync: bool
    from_active: bool  # told by the active process itself, else by its last heartbeat


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    node_id: str
    connected: dict[str, bool]  # node id -> linked now (this node included)
    handlers: dict[str, str]  # node id -> "LOCAL", "REMOTE" or ""
    problems: list[str]
    consumers: dict[str, dict[str, int]]  # node id -> queue -> consumers, as this node sees it
    ha: list[HaPairStatus]


def from_unix_ms(unix_ms: int) -> datetime | None:
    return datetime.fromtimestamp(unix_ms / 1000, UTC) if unix_ms else None
