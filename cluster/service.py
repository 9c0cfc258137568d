"""The `pinmq.cluster.v1.Cluster` gRPC service: the server ends of gossip and forwarding."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractContextManager
from typing import Protocol

import grpc
from grpc import aio

from cluster.admin import GroupsHost, node_groups, row_to_pb
from cluster.bridge import ForwardReceiver
from cluster.connector import GossipHost, GossipLink, state_to_pb
from cluster.ha import PairShell, VoterRegistry
from cluster.replication import Replicator
from cluster.topology import Topology
from pinmq_pb import cluster_pb2 as pb
from pinmq_pb import cluster_pb2_grpc as pb_grpc


class ServiceHost(GossipHost, GroupsHost, Protocol):
    """What the service needs of the cluster member that hosts it (`cluster/member.py`)."""

    receiver: ForwardReceiver
    topology: Topology
    replicator: Replicator | None
    pair: PairShell | None  # this node is the active process of an ha pair
    voters: VoterRegistry

    def serving(self) -> AbstractContextManager[None]: ...

    def problems(self) -> list[str]: ...


class ClusterService(pb_grpc.ClusterServicer):
    def __init__(self, cluster: ServiceHost) -> None:
        self.cluster = cluster

    async def Gossip(
        self, request_iterator: AsyncIterator[pb.NodeState], context: aio.ServicerContext
    ) -> None:
        with self.cluster.serving():
            await GossipLink(self.cluster, via=None).serve(context)

    async def Forward(
        self, request_iterator: AsyncIterator[pb.ForwardBatch], context: aio.ServicerContext
    ) -> None:
        with self.cluster.serving():
            await self.cluster.receiver.serve(context)

    async def Inspect(
        self, request: pb.InspectRequest, context: aio.ServicerContext
    ) -> pb.InspectResponse:
        cluster = self.cluster
        name = cluster.config.name
        return pb.InspectResponse(
            node_id=cluster.node_id,
            nodes=[
                pb.NodeInfo(
                    state=state_to_pb(view.state, name),
                    connected=view.connected,
                    local=view.local,
                    down_since_unix_ms=(view.down_since_ns or 0) // 1_000_000,
                )
                for view in cluster.topology.nodes()
            ],
            problems=cluster.problems(),
        )

    async def Groups(
        self, request: pb.GroupsRequest, context: aio.ServicerContext
    ) -> pb.GroupsReply:
        rows = node_groups(self.cluster, request.queue or None, request.group or None)
        return pb.GroupsReply(node_id=self.cluster.node_id, groups=[row_to_pb(r) for r in rows])

    async def Replicate(
        self, request_iterator: AsyncIterator[pb.ReplicaReport], context: aio.ServicerContext
    ) -> None:
        replicator = self.cluster.replicator
        if replicator is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{self.cluster.node_id} is not an ha primary (ha.role: primary)",
            )
            return
        with self.cluster.serving():
            await replicator.serve(request_iterator, context)

    async def Failover(
        self, request: pb.FailoverEnvelope, context: aio.ServicerContext
    ) -> pb.FailoverReplies:
        pair = self.cluster.pair
        if pair is not None and pair.hears(request):
            return pb.FailoverReplies(replies=pair.receive(request))
        return pb.FailoverReplies(replies=self.cluster.voters.receive(request))
