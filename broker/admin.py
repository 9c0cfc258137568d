"""What the client-facing Admin API needs of the cluster, as interfaces.

The protocol shells never import cluster/: a clustered node hands them `cluster/admin.py`'s
ClusterAdministration, a standalone node nothing, and the cluster calls are then refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class ClusterGroupView(Protocol):
    """A group on one queue instance: its binding and its table entry there."""

    group: str
    queue: str
    node: str
    bound: bool
    owner: str | None
    owner_name: str | None
    pending: int
    outstanding: int
    last_use_unix_ms: int


class NodeStatusView(Protocol):
    node_id: str
    connected: bool
    handler: str
    consumers: Mapping[str, int]


class HaPairView(Protocol):
    logical: str
    epoch: int
    active: str
    backup: str
    backup_in_sync: bool
    from_active: bool


class ClusterAdmin(Protocol):
    node_id: str

    async def groups(
        self, queue: str | None, group: str | None
    ) -> tuple[Sequence[ClusterGroupView], list[str]]:
        """Every group of the cluster (of one queue, one group), and who did not answer."""
        ...

    def problems(self) -> list[str]: ...

    async def reset_group(self, group: str, queue: str | None, force: bool = False) -> int:
        """Unbind a group cluster-wide; raises CoreError (with its gRPC code) if refused.

        A group bound to a node that is not connected is refused unless `force`.
        """
        ...

    def status(self) -> Sequence[NodeStatusView]: ...

    def ha(self) -> Sequence[HaPairView]:
        """The LOCAL node's pair: the active process, its epoch, its backup (ha)."""
        ...
