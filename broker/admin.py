"""What the client-facing Admin API needs of the cluster, as an interface.

The protocol shells never import cluster/: a clustered node hands them `cluster/admin.py`'s
ClusterAdministration, a standalone node nothing, and the cluster calls are then refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from broker.info import ClusterGroupInfo, HaPairStatus, NodeStatus


class ClusterAdmin(Protocol):
    node_id: str

    async def groups(
        self, queue: str | None, group: str | None
    ) -> tuple[Sequence[ClusterGroupInfo], list[str]]:
        """Every group of the cluster (of one queue, one group), and who did not answer."""
        ...

    def problems(self) -> list[str]: ...

    async def reset_group(self, group: str, queue: str | None, force: bool = False) -> int:
        """Unbind a group cluster-wide; raises CoreError (with its gRPC code) if refused.

        A group bound to a node that is not connected is refused unless `force`.
        """
        ...

    def status(self) -> Sequence[NodeStatus]: ...

    def ha(self) -> Sequence[HaPairStatus]:
        """A pair: the active process, its epoch, its backup (ha)."""
        ...
