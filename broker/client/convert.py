"""The admin answers' protobuf messages as the node's records (`broker/info.py`): the client's
one edge between the wire and the records, the mirror of the node's `pinmq/grpc_admin.py`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.client.errors import InvalidArgument
from broker.client.info import ClusterGroups, ClusterStatus
from broker.info import (
    ClusterGroupInfo,
    ConsumerInfo,
    GroupInfo,
    HaPairStatus,
    QueueInfo,
    from_table_fields,
)
from pinmq_pb import client_pb2 as pb

# Optional string settings: absent on the wire is None here.
_NULLABLE = ("group_first_key", "default_group", "dead_letter_address")


def queue_info(q: pb.QueueInfo) -> QueueInfo:
    return QueueInfo(q.name, q.address, q.depth, q.consumer_count, settings_dict(q.settings))


def group_info(g: pb.GroupInfo) -> GroupInfo:
    return GroupInfo(group=g.group, **from_table_fields(g))


def consumer_info(c: pb.ConsumerInfo) -> ConsumerInfo:
    return ConsumerInfo(
        c.consumer_id, c.name, c.prefetch, c.unacked, c.groups, c.stalled_ms, c.delivered, c.acked
    )


def cluster_groups(reply: pb.ClusterGroupsResponse) -> ClusterGroups:
    return ClusterGroups(
        groups=[
            ClusterGroupInfo(g.group, g.queue, g.node, g.bound, **from_table_fields(g))
            for g in reply.groups
        ],
        unreachable=list(reply.unreachable),
        problems=list(reply.problems),
    )


def cluster_status(reply: pb.ClusterStatusResponse) -> ClusterStatus:
    return ClusterStatus(
        node_id=reply.node_id,
        connected={n.node_id: n.connected for n in reply.nodes},
        handlers={n.node_id: n.handler for n in reply.nodes},
        problems=list(reply.problems),
        consumers={n.node_id: dict(n.consumers) for n in reply.nodes},
        ha=[
            HaPairStatus(p.logical, p.epoch, p.active, p.backup, p.backup_in_sync, p.from_active)
            for p in reply.ha
        ],
        not_ready=list(reply.not_ready),
    )


def settings_pb(settings: Mapping[str, Any]) -> pb.QueueSettings:
    """Queue settings keyed as in the node config (`group-buckets` or `group_buckets`)."""
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


def settings_dict(settings: pb.QueueSettings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for desc in settings.DESCRIPTOR.fields:
        if settings.HasField(desc.name):
            value = getattr(settings, desc.name)
            out[desc.name] = None if desc.name in _NULLABLE and value == "" else value
    return out
