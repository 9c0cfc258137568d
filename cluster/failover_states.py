"""The states of a pair member (cluster/failover.py) and the one table of their transitions.

A member is in exactly one `Role` at a time. When something happens to it (an `Event`: a wait
ran out, a quorum answered, a rival outranked it), `next_role` looks (role, event) up in
`TRANSITIONS`: every transition is listed here once, and one that is not listed raises
`BadTransition`, a bug in the caller. The member decides when an event has happened, and does
what entering its new role takes.
"""

from __future__ import annotations

import enum


class Role(enum.Enum):
    PASSIVE = "passive"  # follows the active it hears; stands once it heard none for a while
    PRE_CANDIDATE = "pre-candidate"  # asks whether a quorum would vote for it; still follows
    CANDIDATE = "candidate"  # asks for votes at a new epoch
    ACTIVE = "active"  # elected: serves while it holds a quorum of promises
    RELEASING = "releasing"  # stopped serving to hand over to its in-sync peer (failback)

    @property
    def follows(self) -> bool:
        """It follows the active it last heard (replication, in-sync state): a pre-vote asks
        and promises nothing, so the member asking still follows."""
        return self in (Role.PASSIVE, Role.PRE_CANDIDATE)


class Event(enum.Enum):
    QUIET = "no active heard for its patience, and its data lets it stand"
    PRE_VOTED = "a quorum would vote for it"
    HANDOVER = "the active it follows in sync handed the node over"
    ELECTED = "a quorum voted for it"
    TIMED_OUT = "a failure-timeout passed without the answers it waits for"
    OUTRANKED = "an active's heartbeat accepted, a vote given, or a newer epoch learnt"
    FAILBACK = "its in-sync peer, the primary, wants the node back"


TRANSITIONS: dict[Role, dict[Event, Role]] = {
    Role.PASSIVE: {
        Event.QUIET: Role.PRE_CANDIDATE,
        Event.HANDOVER: Role.CANDIDATE,
        Event.OUTRANKED: Role.PASSIVE,
    },
    Role.PRE_CANDIDATE: {
        Event.PRE_VOTED: Role.CANDIDATE,
        Event.HANDOVER: Role.CANDIDATE,
        Event.TIMED_OUT: Role.PASSIVE,
        # The question stays open until it times out: the voters' answers decide, and one that
        # hears an active refuses.
        Event.OUTRANKED: Role.PRE_CANDIDATE,
    },
    Role.CANDIDATE: {
        Event.ELECTED: Role.ACTIVE,
        Event.TIMED_OUT: Role.PASSIVE,
        Event.OUTRANKED: Role.PASSIVE,
    },
    Role.ACTIVE: {
        Event.FAILBACK: Role.RELEASING,
        Event.OUTRANKED: Role.PASSIVE,
    },
    Role.RELEASING: {
        Event.TIMED_OUT: Role.PASSIVE,  # the handover did not happen: stand again later
        Event.OUTRANKED: Role.PASSIVE,
    },
}


class BadTransition(RuntimeError):
    """An event that the role it happened in does not take: a bug in the state machine."""


def takes(role: Role, event: Event) -> bool:
    return event in TRANSITIONS[role]


def next_role(role: Role, event: Event) -> Role:
    try:
        return TRANSITIONS[role][event]
    except KeyError:
        raise BadTransition(f"{event.name} in {role.name}: not a transition") from None
