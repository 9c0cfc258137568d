"""What the admin calls answer that only the client puts together: the cluster's groups and
status. The records they hold are the node's own (`broker/info.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from broker.info import ClusterGroupInfo, HaPairStatus


@dataclass(slots=True, frozen=True)
class ClusterGroups:
    groups: list[ClusterGroupInfo]
    unreachable: list[str]  # nodes (or the grouping handler) that did not answer
    problems: list[str]


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    node_id: str
    connected: dict[str, bool]  # node id -> linked now (this node included)
    handlers: dict[str, str]  # node id -> "LOCAL", "REMOTE" or ""
    problems: list[str]
    consumers: dict[str, dict[str, int]]  # node id -> queue -> consumers, as this node sees it
    ha: list[HaPairStatus]
    not_ready: list[str]  # why the answering node is not ready (GET /readyz's reasons)
