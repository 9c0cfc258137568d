"""The failover messages of cluster/failover.py on the wire (`Cluster.Failover`), both ways."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from cluster.failover_messages import (
    Handover,
    Heartbeat,
    HeartbeatReply,
    Message,
    Record,
    VoteReply,
    VoteRequest,
)
from pinmq_pb import cluster_pb2 as pb

_WIRE: dict[type, tuple[str, Any]] = {
    Heartbeat: ("heartbeat", pb.HaHeartbeat),
    HeartbeatReply: ("heartbeat_reply", pb.HaHeartbeatReply),
    VoteRequest: ("vote_request", pb.HaVoteRequest),
    VoteReply: ("vote_reply", pb.HaVoteReply),
    Handover: ("handover", pb.HaHandover),
}
_MESSAGES = {name: cls for cls, (name, _) in _WIRE.items()}


def to_pb(
    logical: str, message: Message, failure_timeout_ms: int = 0, to_peer: bool = False
) -> pb.FailoverEnvelope:
    name, cls = _WIRE[type(message)]
    values = {f.name: getattr(message, f.name) for f in fields(message)}
    if isinstance(message, VoteReply):
        record = message.record
        values["record"] = pb.HaRecord(
            epoch=record.epoch,
            active=record.active or "",
            backup=record.backup or "",
            backup_in_sync=record.backup_in_sync,
            seq=record.seq,
        )
    return pb.FailoverEnvelope(
        logical=logical,
        failure_timeout_ms=failure_timeout_ms,
        to_peer=to_peer,
        **{name: cls(**values)},
    )


def from_pb(envelope: pb.FailoverEnvelope) -> Message | None:
    """The message an envelope holds; None for an empty or unknown one."""
    name = envelope.WhichOneof("message")
    cls = _MESSAGES.get(name or "")
    if cls is None:
        return None
    wire = getattr(envelope, name)  # type: ignore[arg-type]
    values = {f.name: getattr(wire, f.name) for f in fields(cls)}
    if cls is VoteReply:
        r = wire.record
        values["record"] = Record(
            r.epoch, r.active or None, r.backup or None, r.backup_in_sync, r.seq
        )
    return cls(**values)  # type: ignore[no-any-return]
