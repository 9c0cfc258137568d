"""The messages members of an ha pair and its voters exchange (cluster/failover.py), and the
record of the active that every member keeps. Plain frozen data: cluster/ha_wire.py puts them
on the wire, the shells (cluster/ha.py) move them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Record:
    """What the last accepted active said: persisted by every member, so a restart keeps it."""

    epoch: int = 0
    active: str | None = None
    backup: str | None = None
    backup_in_sync: bool = False
    seq: int = 0


@dataclass(frozen=True)
class Heartbeat:
    """From the active to every other member: its epoch and what its backup holds."""

    sender: str
    epoch: int
    seq: int
    backup: str  # the sender's peer
    backup_in_sync: bool
    releasing: bool = False  # the sender stopped serving and frees the promises (failback)


@dataclass(frozen=True)
class HeartbeatReply:
    sender: str
    epoch: int  # the heartbeat's
    seq: int
    accepted: bool
    known_epoch: int
    wants_failback: bool = False  # from a passive primary with allow-failback, once in sync


@dataclass(frozen=True)
class VoteRequest:
    candidate: str
    epoch: int
    data_epoch: int  # epoch of the newest active whose data the candidate holds in full
    pre: bool = False  # "would you?": answered alike, but nothing is promised or recorded


@dataclass(frozen=True)
class VoteReply:
    sender: str
    epoch: int
    granted: bool
    known_epoch: int
    record: Record  # the voter's: a candidate learns from it what an active announced
    pre: bool = False


@dataclass(frozen=True)
class Handover:
    """From an active that stopped serving to its in-sync peer: take over now."""

    sender: str
    epoch: int


Message = Heartbeat | HeartbeatReply | VoteRequest | VoteReply | Handover


@dataclass(frozen=True)
class Send:
    to: str
    message: Message
