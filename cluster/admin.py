"""Cluster-wide group listings: the LOCAL handler's bindings merged with every node's group tables.

A binding says where a group goes (`queue@node`); the group table of that node's queue says
who consumes it there, what is pending and when it was last used. An operator wants both in
one answer, for the whole cluster, so the node asked gathers the bindings (from the LOCAL
grouping handler) and every node's table (the `Groups` RPC of the cluster service) at once
and `merge`s them. Nodes that do not answer are named, never silently left out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import replace
from typing import Protocol

from grpc import aio

from broker import channels
from broker.config import ClusterSection
from broker.core import CoreError
from broker.info import (
    NS_PER_MS,
    ClusterGroupInfo,
    HaPairStatus,
    NodeStatus,
    from_table_fields,
    table_fields,
)
from cluster.bridge import SF_PREFIX
from cluster.connector import CHANNEL_OPTIONS
from cluster.ha import PairShell, VoterRegistry, known_pairs
from cluster.local import LocalEngine
from cluster.replication import Replicator
from cluster.topology import Topology
from handler.api import BindingUse, GroupingHandler, HandlerUnavailable
from pinmq_pb import cluster_pb2 as pb
from pinmq_pb import cluster_pb2_grpc as pb_grpc

PEER_TIMEOUT_S = 5.0


class GroupsHost(Protocol):
    """What the group listings need of the cluster member (`cluster/member.py`)."""

    engine: LocalEngine
    node_id: str
    config: ClusterSection
    topology: Topology
    pair: PairShell | None
    replicator: Replicator | None
    voters: VoterRegistry

    def peer_address(self, node_id: str) -> str | None: ...

    def dial(self, address: str, options: channels.Options) -> aio.Channel: ...

    def problems(self) -> list[str]: ...


def node_groups(
    cluster: GroupsHost, queue: str | None, group: str | None
) -> list[ClusterGroupInfo]:
    """This node's group table rows of its clustered queues (of one queue, one group); their
    `bound` is left False: the bindings say (`merge`)."""
    covers = cluster.config.covers
    rows: list[ClusterGroupInfo] = []
    for q in cluster.engine.queues():
        if (queue and q.name != queue) or q.name.startswith(SF_PREFIX) or not covers(q.address):
            continue
        for g in q.groups():
            if group and g.group != group:
                continue
            rows.append(
                ClusterGroupInfo(
                    g.group,
                    q.name,
                    cluster.node_id,
                    False,
                    g.owner,
                    g.owner_name,
                    g.pending,
                    g.outstanding,
                    g.last_use_ns,
                    g.oldest_pending_ns,
                )
            )
    return rows


def row_to_pb(row: ClusterGroupInfo) -> pb.GroupRow:
    return pb.GroupRow(queue=row.queue, group=row.group, **table_fields(row))


def row_from_pb(node: str, row: pb.GroupRow) -> ClusterGroupInfo:
    return ClusterGroupInfo(row.group, row.queue, node, False, **from_table_fields(row))


def merge(
    bindings: Iterable[BindingUse], rows: Iterable[ClusterGroupInfo]
) -> list[ClusterGroupInfo]:
    """One entry per (group, queue, node): bound there, present in its table, or both.

    A group present on a node it is not bound to (messages that were already there when
    its binding moved, or an address without grouping handler) is listed as not bound.
    """
    merged: dict[tuple[str, str, str], ClusterGroupInfo] = {}
    for binding, last_use_ms in bindings:
        key = (binding.group, binding.queue, binding.node)
        merged[key] = ClusterGroupInfo(*key, bound=True, last_use_ns=last_use_ms * NS_PER_MS)
    for row in rows:
        key = (row.group, row.queue, row.node)
        bound = merged.get(key)
        merged[key] = replace(
            row,
            bound=bound is not None,
            last_use_ns=max(row.last_use_ns, bound.last_use_ns if bound else 0),
        )
    return sorted(merged.values(), key=lambda e: (e.queue, e.group, e.node))


async def cluster_groups(
    cluster: GroupsHost,
    handler: GroupingHandler | None,
    queue: str | None = None,
    group: str | None = None,
) -> tuple[list[ClusterGroupInfo], list[str]]:
    """Every group of the cluster (of one queue, one group) and who did not answer."""
    unreachable: list[str] = []

    async def bindings() -> list[BindingUse]:
        if handler is None:
            return []
        try:
            listed = await handler.list_bindings(group, limit=0)
        except HandlerUnavailable as err:
            unreachable.append(f"grouping handler: {err}")
            return []
        return [b for b in listed if not queue or b.binding.queue == queue]

    async def table(peer: str) -> list[ClusterGroupInfo]:
        address = cluster.peer_address(peer)
        if address is None or not cluster.topology.is_connected(peer):
            unreachable.append(f"{peer}: not connected")
            return []
        request = pb.GroupsRequest(queue=queue or "", group=group or "")
        try:
            async with cluster.dial(address, CHANNEL_OPTIONS) as channel:
                reply = await pb_grpc.ClusterStub(channel).Groups(request, timeout=PEER_TIMEOUT_S)
        except aio.AioRpcError as err:
            unreachable.append(f"{peer}: {err.code().name}: {err.details()}")
            return []
        return [row_from_pb(reply.node_id, r) for r in reply.groups]

    listed, *tables = await asyncio.gather(
        bindings(), *(table(peer) for peer in cluster.topology.peers())
    )
    rows = node_groups(cluster, queue, group) + [r for t in tables for r in t]
    return merge(listed, rows), sorted(unreachable)


class ClusterAdministration:
    """The cluster side of the client Admin API (`broker/admin.py`'s ClusterAdmin)."""

    def __init__(self, cluster: GroupsHost, handler: GroupingHandler | None) -> None:
        self.cluster = cluster
        self.handler = handler
        self.node_id = cluster.node_id

    async def groups(
        self, queue: str | None, group: str | None
    ) -> tuple[list[ClusterGroupInfo], list[str]]:
        return await cluster_groups(self.cluster, self.handler, queue, group)

    def problems(self) -> list[str]:
        return self.cluster.problems()

    def ha(self) -> list[HaPairStatus]:
        cluster = self.cluster
        replicator = cluster.replicator
        in_sync = replicator.status()["backup_in_sync"] if replicator is not None else None
        return known_pairs(cluster.pair, in_sync, cluster.voters)

    async def reset_group(self, group: str, queue: str | None, force: bool = False) -> int:
        """Unbind a group at the LOCAL handler; CoreError (with a gRPC code) when it cannot.

        Refused, unless `force`, while the group is bound to a node that is not connected:
        messages of the group wait there and in store-and-forward toward it, and follow the
        group to its next binding when that node returns: after the group's newer messages.
        """
        if self.handler is None:
            raise AdminRefused("failed_precondition", "this node has no grouping handler")
        if not group:
            raise AdminRefused("invalid_argument", "group must not be empty")
        try:
            if not force:
                away = await self._bound_away(self.handler, group, queue)
                if away:
                    raise AdminRefused(
                        "failed_precondition",
                        f"group {group} is bound to {', '.join(away)}, which is not connected: "
                        "its messages wait for that node; force moves the group anyway, and "
                        "the messages waiting for that node follow the group when it returns, "
                        "after the group's newer messages",
                    )
            return await self.handler.unbind(group, queue)
        except HandlerUnavailable as err:
            raise AdminRefused("unavailable", str(err)) from None

    async def _bound_away(
        self, handler: GroupingHandler, group: str, queue: str | None
    ) -> list[str]:
        """The instances (queue@node) the group is bound to on nodes not connected now."""
        topology = self.cluster.topology
        return sorted(
            f"{use.binding.queue}@{use.binding.node}"
            for use in await handler.list_bindings(group, limit=0)
            if (queue is None or use.binding.queue == queue)
            and use.binding.node != self.node_id
            and not topology.is_connected(use.binding.node)
        )

    def status(self) -> list[NodeStatus]:
        return [
            NodeStatus(
                view.state.node_id,
                view.connected,
                view.state.handler or "",
                {q: n for queues in view.state.instances.values() for q, n in queues.items()},
            )
            for view in self.cluster.topology.nodes()
        ]


class AdminRefused(CoreError):
    """A cluster admin request the node refuses; `code` names the gRPC status."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
