"""`Client`: one connection to a node (the first reachable of its addresses) and the admin calls."""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc
from grpc import aio

from broker.audit import AuditLog
from broker.client.base import (
    CALL_TIMEOUT_S,
    CHANNEL_OPTIONS,
    CONNECT_TIMEOUT_S,
    DEFAULT_URL,
    T,
    ready,
)
from broker.client.consumer import Consumer
from broker.client.errors import ConnectionLost, InvalidArgument, from_rpc
from broker.client.info import (
    ClusterGroupInfo,
    ClusterGroups,
    ClusterStatus,
    ConsumerInfo,
    GroupInfo,
    QueueInfo,
    from_unix_ms,
)
from broker.client.producer import Producer
from broker.message import GROUP_ID_HEADER
from pinmq_pb import client_pb2 as pb
from pinmq_pb import client_pb2_grpc as pb_grpc

_NULLABLE = ("group_first_key", "default_group", "dead_letter_address")


def _warn_blocked(text: str) -> None:
    logging.getLogger("pinmq.client").warning(text)


class Client:
    """A connection to one pinmq node: the first reachable address of `url`.

    `url` is "host:port[,host:port...]". Use as `async with Client(url) as client:`.
    With `audit` (a directory, or an `AuditLog`), the client records `client_sent` (once the
    node confirmed the send), `client_received` and `client_acked` events for `pinmq check`,
    and tags every message it sends with a `pinmq-mid` header (producer id / sequence).
    Every request has a deadline, `call_timeout` seconds (a send_many batch: for its result);
    one that passes it fails with `OutcomeUnknown`. A send the node holds for room (address-
    full-policy BLOCK, a full disk) has none: `on_blocked` (default: a logging warning) is
    told and the send waits.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        call_timeout: float = CALL_TIMEOUT_S,
        audit: str | Path | AuditLog | None = None,
        audit_name: str | None = None,
        on_blocked: Callable[[str], None] | None = None,
    ):
        self.addresses = [a.strip() for a in url.split(",") if a.strip()]
        if not self.addresses:
            raise InvalidArgument(f"no address in url {url!r}", "INVALID_ARGUMENT")
        self.target = self.addresses[0]
        self._connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self._channel: aio.Channel | None = None
        self._broker: pb_grpc.BrokerStub
        self._admin: pb_grpc.AdminStub
        # Audit log (broker/audit.py): opened on connect when given a directory.
        self.audit: AuditLog | None = audit if isinstance(audit, AuditLog) else None
        self._audit_dir = None if audit is None or isinstance(audit, AuditLog) else Path(audit)
        self._audit_name = audit_name or f"client-{uuid.uuid4().hex[:8]}"
        self._producers = itertools.count(1)
        self.on_blocked = on_blocked or _warn_blocked

    async def connect(self) -> None:
        """Open a channel to the first address that answers within the connect timeout."""
        failures = []
        for target in self.addresses:
            channel = aio.insecure_channel(target, options=CHANNEL_OPTIONS)
            if not await ready(channel, self._connect_timeout):
                await channel.close()
                failures.append(target)
                continue
            self.target, self._channel = target, channel
            self._broker = pb_grpc.BrokerStub(channel)
            self._admin = pb_grpc.AdminStub(channel)
            if self._audit_dir is not None and self.audit is None:
                self.audit = AuditLog(self._audit_dir, self._audit_name, node=target).start()
            return
        raise ConnectionLost(
            f"cannot reach a pinmq node at {', '.join(failures)} (connection refused or timed out)",
            "UNAVAILABLE",
        )

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        if self._audit_dir is not None and self.audit is not None:
            self.audit.close()
            self.audit = None

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _call(self, method: Callable[..., Awaitable[T]], request: Any) -> T:
        """One unary call with the client's deadline; failures as refused, lost or unknown."""
        try:
            return await method(request, timeout=self.call_timeout)
        except grpc.RpcError as err:
            raise from_rpc(err, self.target) from None

    def _blocked(self) -> None:
        self.on_blocked(
            f"send blocked by {self.target}: the node is full (address-full-policy BLOCK or "
            "limits.max-disk-usage); it completes once consumers make room"
        )

    # ---- producing and consuming ----

    def producer(
        self,
        address: str,
        *,
        group_id: str | None = None,
        auto_group: bool = False,
        group_header: str = GROUP_ID_HEADER,
        persistent: bool = True,
    ) -> Producer:
        """A producer; with `group_id` or `auto_group` every message joins that one group."""
        if group_id is not None and auto_group:
            raise InvalidArgument("give group_id or auto_group, not both", "INVALID_ARGUMENT")
        group = str(uuid.uuid4()) if auto_group else group_id
        producer = Producer(self, address, group, group_header, persistent)
        if self.audit is not None:
            producer.producer_id = f"{self._audit_name}.p{next(self._producers)}"
        return producer

    def consumer(self, queue: str, *, name: str | None = None, prefetch: int = 100) -> Consumer:
        """A consumer of `queue`; it subscribes on first use (iteration or `start()`)."""
        return Consumer(self, queue, name or f"py-{uuid.uuid4().hex[:8]}", prefetch)

    # ---- administration ----

    async def create_queue(
        self, queue: str, *, address: str | None = None, **settings: Any
    ) -> None:
        """Create `queue` on `address` (default: same name); settings as in the node config."""
        request = pb.CreateQueueRequest(
            address=address or queue, queue=queue, settings=_settings_pb(settings)
        )
        await self._call(self._admin.CreateQueue, request)

    async def delete_queue(self, queue: str) -> int:
        """Delete `queue` and its messages; returns how many messages were removed."""
        reply = await self._call(self._admin.DeleteQueue, pb.DeleteQueueRequest(queue=queue))
        return reply.removed_messages

    async def queues(self) -> list[QueueInfo]:
        reply = await self._call(self._admin.ListQueues, pb.ListQueuesRequest())
        return [
            QueueInfo(q.name, q.address, q.depth, q.consumer_count, _settings_dict(q.settings))
            for q in reply.queues
        ]

    async def groups(self, queue: str) -> list[GroupInfo]:
        reply = await self._call(self._admin.ListGroups, pb.ListGroupsRequest(queue=queue))
        return [
            GroupInfo(
                group=g.group,
                owner=g.owner_consumer_id or None,
                owner_name=g.owner_name or None,
                pending=g.pending,
                outstanding=g.outstanding,
                last_use=from_unix_ms(g.last_use_unix_ms),
            )
            for g in reply.groups
        ]

    async def consumers(self, queue: str) -> list[ConsumerInfo]:
        """The queue's consumers: what each holds, and whether it stalls."""
        reply = await self._call(self._admin.ListGroups, pb.ListGroupsRequest(queue=queue))
        return [
            ConsumerInfo(c.consumer_id, c.name, c.prefetch, c.unacked, c.groups, c.stalled_ms)
            for c in reply.consumers
        ]

    async def reset_groups(self, queue: str, group: str | None = None) -> None:
        """Unpin one group (or all): their next messages may go to any consumer."""
        request = pb.ResetGroupsRequest(queue=queue, group=group)
        await self._call(self._admin.ResetGroups, request)

    # ---- the cluster (clustered nodes only) ----

    async def cluster_groups(
        self, queue: str | None = None, *, group: str | None = None
    ) -> ClusterGroups:
        """Every group of the cluster (of one queue, one group) in one call, from any node."""
        request = pb.ClusterGroupsRequest(queue=queue or "", group=group or "")
        reply = await self._call(self._admin.ClusterGroups, request)
        return ClusterGroups(
            groups=[
                ClusterGroupInfo(
                    group=g.group,
                    queue=g.queue,
                    node=g.node,
                    bound=g.bound,
                    owner=g.owner_consumer_id or None,
                    owner_name=g.owner_name or None,
                    pending=g.pending,
                    outstanding=g.outstanding,
                    last_use=from_unix_ms(g.last_use_unix_ms),
                )
                for g in reply.groups
            ],
            unreachable=list(reply.unreachable),
            problems=list(reply.problems),
        )

    async def cluster_reset_group(
        self, group: str, queue: str | None = None, *, force: bool = False
    ) -> int:
        """Unbind a group cluster-wide (on one queue, or every queue); every node unpins it.

        Returns how many bindings were removed. A group bound to a node that is not connected
        is refused (`FAILED_PRECONDITION`) unless `force`: its messages wait for that node,
        and after a forced move they reach a consumer when it returns, out of order.
        """
        request = pb.ClusterResetGroupRequest(group=group, queue=queue, force=force)
        reply = await self._call(self._admin.ClusterResetGroup, request)
        return reply.removed

    async def cluster_status(self) -> ClusterStatus:
        reply = await self._call(self._admin.ClusterStatus, pb.ClusterStatusRequest())
        return ClusterStatus(
            node_id=reply.node_id,
            connected={n.node_id: n.connected for n in reply.nodes},
            handlers={n.node_id: n.handler for n in reply.nodes},
            problems=list(reply.problems),
            consumers={n.node_id: dict(n.consumers) for n in reply.nodes},
        )


def _settings_pb(settings: Mapping[str, Any]) -> pb.QueueSettings:
    values = {}
    for key, value in settings.items():
        name = key.replace("-", "_")
        if name not in pb.QueueSettings.DESCRIPTOR.fields_by_name:
            raise InvalidArgument(f"unknown queue setting {key!r}", "INVALID_ARGUMENT")
        values[name] = "" if value is None and name in _NULLABLE else value
    try:
        return pb.QueueSettings(**values)
    except (TypeError, ValueError) as err:
        raise InvalidArgument(f"bad queue setting: {err}", "INVALID_ARGUMENT") from None


def _settings_dict(settings: pb.QueueSettings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for desc in settings.DESCRIPTOR.fields:
        if settings.HasField(desc.name):
            value = getattr(settings, desc.name)
            out[desc.name] = None if desc.name in _NULLABLE and value == "" else value
    return out
