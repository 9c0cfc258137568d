"""The client-facing Admin service: queues, their groups and consumers, and the cluster's.

Listings read the engine's queues (read-only views) and turn the node's records
(`broker/info.py`) into protobuf messages here, the node's one edge between the two (the
client's is `broker/client/convert.py`); changes go through the engine's commands. The
cluster calls need `broker/admin.py`'s ClusterAdmin, which a standalone node does not have:
they are refused. `Metrics` answers what `GET /metrics` serves, from the same registry, so
`pinmq top` reads the same figures Prometheus does over the client's own connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from grpc import aio
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry
from pydantic import ValidationError

from broker.access import Access
from broker.admin import ClusterAdmin
from broker.clock import now_ns
from broker.config import QueueConfig
from broker.config_security import Permission
from broker.core import CoreError
from broker.engine import Engine
from broker.info import table_fields
from broker.permissions import Denied
from broker.readiness import Readiness
from pinmq.grpc_access import Gate
from pinmq_pb import client_pb2 as pb
from pinmq_pb import client_pb2_grpc as pb_grpc

_NULLABLE = frozenset(("group_first_key", "default_group", "dead_letter_address"))
_SETTINGS_FIELDS = tuple(f.name for f in pb.QueueSettings.DESCRIPTOR.fields)


class AdminService(pb_grpc.AdminServicer):
    """Each call needs a permission: `create`, `delete`, `browse` (listings) or `manage`
    (resetting groups; the cluster's group map and status; metrics) on the queue's address,
    or on every address for a call that names no queue.

    `metrics`: the node's registry (`pinmq/metrics.py`); `readiness`: what `GET /readyz`
    answers, whose reasons ClusterStatus reports too.
    """

    def __init__(
        self,
        engine: Engine,
        admin: ClusterAdmin | None,
        gate: Gate,
        metrics: CollectorRegistry,
        readiness: Callable[[], Readiness],
    ) -> None:
        self.engine = engine
        self.admin = admin
        self.gate = gate
        self.metrics = metrics
        self.readiness = readiness

    async def _allowed(
        self, context: aio.ServicerContext, permission: Permission, address: str | None
    ) -> Access:
        """The caller's access, if it holds `permission` on `address` (None: on every one)."""
        access = await self.gate.access(context)
        try:
            if address is None:
                access.check_global(permission)
            else:
                access.check(permission, address)
        except Denied as err:
            await self.gate.deny(context, err)
        return access

    def _address_of(self, queue: str) -> str:
        """The address a queue is bound to (the name itself when there is no such queue)."""
        try:
            return self.engine.queue(queue).address
        except CoreError:
            return queue

    async def CreateQueue(
        self, request: pb.CreateQueueRequest, context: aio.ServicerContext
    ) -> pb.CreateQueueResponse:
        if not request.queue or not request.address:
            await self.gate.refuse(
                context, grpc.StatusCode.INVALID_ARGUMENT, "address and queue must not be empty"
            )
        await self._allowed(context, "create", request.address)
        base = self.engine.config.queue_config_for(request.address).model_dump()
        try:
            settings = QueueConfig.model_validate({**base, **_settings_values(request.settings)})
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}"
                for e in err.errors()
            )
            await self.gate.refuse(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"invalid settings: {problems}"
            )
        try:
            await self.engine.create_queue(request.address, request.queue, settings)
        except Exception as err:
            await self.gate.abort(context, err)
        return pb.CreateQueueResponse()

    async def DeleteQueue(
        self, request: pb.DeleteQueueRequest, context: aio.ServicerContext
    ) -> pb.DeleteQueueResponse:
        await self._allowed(context, "delete", self._address_of(request.queue))
        try:
            removed = await self.engine.delete_queue(request.queue)
        except Exception as err:
            await self.gate.abort(context, err)
        return pb.DeleteQueueResponse(removed_messages=removed)

    async def ListQueues(
        self, request: pb.ListQueuesRequest, context: aio.ServicerContext
    ) -> pb.ListQueuesResponse:
        access = await self.gate.access(context)  # lists the queues the user may browse
        return pb.ListQueuesResponse(
            queues=[
                pb.QueueInfo(
                    name=q.name,
                    address=q.address,
                    depth=q.depth,
                    consumer_count=q.consumer_count,
                    settings=_settings_pb(q.settings),
                )
                for q in self.engine.queues()
                if access.allows("browse", q.address)
            ]
        )

    async def ListGroups(
        self, request: pb.ListGroupsRequest, context: aio.ServicerContext
    ) -> pb.ListGroupsResponse:
        await self._allowed(context, "browse", self._address_of(request.queue))
        try:
            queue = self.engine.queue(request.queue)
        except CoreError as err:
            await self.gate.abort(context, err)
        groups = queue.groups()
        return pb.ListGroupsResponse(
            consumers=[
                pb.ConsumerInfo(
                    consumer_id=c.consumer_id,
                    name=c.name,
                    prefetch=c.prefetch,
                    unacked=c.unacked,
                    groups=c.groups,
                    stalled_ms=c.stalled_ms,
                    delivered=c.delivered,
                    acked=c.acked,
                )
                for c in queue.consumers(now_ns())
            ],
            groups=[pb.GroupInfo(group=g.group, **table_fields(g)) for g in groups],
        )

    async def ResetGroups(
        self, request: pb.ResetGroupsRequest, context: aio.ServicerContext
    ) -> pb.ResetGroupsResponse:
        group = request.group if request.HasField("group") else None
        await self._allowed(context, "manage", self._address_of(request.queue))
        try:
            with self.engine.unit() as unit:
                unit.reset_groups(request.queue, group)
            if unit.write is not None:
                await unit.write
        except Exception as err:
            await self.gate.abort(context, err)
        return pb.ResetGroupsResponse()

    # ---- the cluster ----

    async def _clustered(self, context: aio.ServicerContext) -> ClusterAdmin:
        if self.admin is None:
            await self.gate.refuse(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                "this node is not clustered (no cluster section)",
            )
        return self.admin  # type: ignore[return-value]

    async def ClusterGroups(
        self, request: pb.ClusterGroupsRequest, context: aio.ServicerContext
    ) -> pb.ClusterGroupsResponse:
        await self._allowed(context, "manage", self._address_of(request.queue) or None)
        admin = await self._clustered(context)
        groups, unreachable = await admin.groups(request.queue or None, request.group or None)
        return pb.ClusterGroupsResponse(
            groups=[
                pb.ClusterGroupInfo(
                    group=g.group, queue=g.queue, node=g.node, bound=g.bound, **table_fields(g)
                )
                for g in groups
            ],
            unreachable=unreachable,
            problems=admin.problems(),
        )

    async def ClusterResetGroup(
        self, request: pb.ClusterResetGroupRequest, context: aio.ServicerContext
    ) -> pb.ClusterResetGroupResponse:
        queue = request.queue if request.HasField("queue") else None
        await self._allowed(context, "manage", None if queue is None else self._address_of(queue))
        admin = await self._clustered(context)
        try:
            removed = await admin.reset_group(request.group, queue, request.force)
        except CoreError as err:
            await self.gate.abort(context, err)
        return pb.ClusterResetGroupResponse(removed=removed)

    async def ClusterStatus(
        self, request: pb.ClusterStatusRequest, context: aio.ServicerContext
    ) -> pb.ClusterStatusResponse:
        await self._allowed(context, "manage", None)
        admin = await self._clustered(context)
        return pb.ClusterStatusResponse(
            node_id=admin.node_id,
            nodes=[
                pb.ClusterNodeStatus(
                    node_id=n.node_id,
                    connected=n.connected,
                    handler=n.handler,
                    consumers=n.consumers,
                )
                for n in admin.status()
            ],
            problems=admin.problems(),
            ha=[
                pb.HaPairStatus(
                    logical=p.logical,
                    epoch=p.epoch,
                    active=p.active,
                    backup=p.backup,
                    backup_in_sync=p.backup_in_sync,
                    from_active=p.from_active,
                )
                for p in admin.ha()
            ],
            not_ready=self.readiness().details["reasons"],
        )

    async def Metrics(
        self, request: pb.MetricsRequest, context: aio.ServicerContext
    ) -> pb.MetricsResponse:
        """As `GET /metrics` (the same permission): read now, on the loop, like a scrape."""
        await self._allowed(context, "manage", None)
        return pb.MetricsResponse(text=generate_latest(self.metrics).decode())


def _settings_values(settings: pb.QueueSettings) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in _SETTINGS_FIELDS:
        if settings.HasField(name):
            value = getattr(settings, name)
            values[name] = None if name in _NULLABLE and value == "" else value
    return values


def _settings_pb(settings: QueueConfig) -> pb.QueueSettings:
    values = {name: getattr(settings, name) for name in _SETTINGS_FIELDS}
    return pb.QueueSettings(
        **{k: ("" if v is None and k in _NULLABLE else v) for k, v in values.items()}
    )
