"""The records a queue keeps: a group with its state machine and its page, and a consumer.

A group is in one of three states, and may be held on top of any of them:

    state      owner  with messages waiting, it sits in    its next message goes to
    UNOWNED    none   the queue's `unowned` run queue       the consumer dispatch picks (pin)
    OWNED      one    its owner's `ready` run queue         its owner
    DETACHING  one    no run queue                          nobody: it is unpinned once its
                                                            outstanding messages settle
    + HELD     as is  no run queue                          nobody, until `unhold`

HELD is a bit on the other three, not a fourth state: a clustered node holds a group while it
confirms where the group is bound (cluster/claims.py), and whatever the answer the group keeps
its owner and the messages out at it; bound here after all, it goes on at the same consumer.

The transitions, the only writers of `Group.state` (any other is a bug: IllegalTransition):

    pin     UNOWNED -> OWNED               dispatch hands a new group to a consumer; that
                                           delivery is the first of the group it gets
    detach  OWNED -> DETACHING             reset-groups or a rebalance while messages of the
                                           group are out, or its closing message (a negative
                                           JMSXGroupSeq) delivered
    unpin   OWNED | DETACHING -> UNOWNED   nothing out any more, and detaching or the group
                                           mode is shared; its owner closed; reset-groups or
                                           a rebalance while nothing is out
    hold    s -> s + HELD                  (s not held)
    unhold  s + HELD -> s

detach and unpin leave HELD as it is; pin needs the group unheld. "The next delivery is the
first of the group for its owner" is not a state: it is the delivery that pins the group.

A group's record is created by its first message (or by `hold`) and forgotten once it holds
nothing (no message waiting, paged or out) as it is unpinned, unheld, or moved away
(`Queue.take_group`); an owned idle group stays, pinned.

The state is a small int (bits, module constants) rather than an Enum: dispatch reads it for
every message, and an int costs no more time than the booleans it replaces and one slot
instead of three (16 bytes less per group, with `fresh` gone too).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.message import Message

UNOWNED = 0
OWNED = 1
DETACHING = 2
HELD = 4
OWNERSHIP = OWNED | DETACHING  # the bits that say who has the group
_NAMES = {UNOWNED: "UNOWNED", OWNED: "OWNED", DETACHING: "DETACHING"}


def state_name(state: int) -> str:
    """`OWNED`, `DETACHING+HELD`, ...: for error messages and tests."""
    name = _NAMES.get(state & OWNERSHIP, f"?{state}")
    return f"{name}+HELD" if state & HELD else name


class IllegalTransition(RuntimeError):
    """A group was asked for a transition its state does not allow: a bug in the queue core,
    never a client's mistake (so not a QueueError, which the shells answer to clients)."""

    def __init__(self, group: Group, transition: str) -> None:
        super().__init__(f"group {group.key!r}: no {transition} from {state_name(group.state)}")


class Page:
    """The msg ids of a group's messages that are on disk only, oldest first: 8 bytes each
    (broker/paging.py keeps them).

    Reading back takes from the front (`front`, then `drop`); a spill puts older ids back
    in front (`push_front`).
    """

    __slots__ = ("ids", "pos")

    def __init__(self) -> None:
        self.ids = array("q")
        self.pos = 0  # ids before this were read back

    def __len__(self) -> int:
        return len(self.ids) - self.pos

    def append(self, msg_id: int) -> None:
        self.ids.append(msg_id)

    def extend(self, msg_ids: array) -> None:
        self.ids.extend(msg_ids)

    def front(self, n: int) -> list[int]:
        return self.ids[self.pos : self.pos + n].tolist()

    def drop(self, n: int) -> None:
        self.pos += n
        if self.pos > 4096 and self.pos * 2 > len(self.ids):  # amortised O(1) per id
            del self.ids[: self.pos]
            self.pos = 0

    def push_front(self, msg_ids: list[int]) -> None:
        """Older ids (ascending) go before the rest."""
        self.ids = array("q", msg_ids) + self.ids[self.pos :]
        self.pos = 0


class Group:
    """Kept small on purpose: one of these lives for every pinned group, idle or not."""

    __slots__ = ("key", "last_use_ns", "outstanding", "owner", "page", "pending", "slot", "state")

    def __init__(self, key: str) -> None:
        self.key = key
        self.state = UNOWNED
        self.pending: deque[Message] | None = None  # None while empty: an empty deque is ~600 B
        self.page: Page | None = None  # its newest messages, on disk only (broker/paging.py)
        self.owner: Consumer | None = None
        self.outstanding = 0  # its messages delivered to `owner` and not settled yet
        self.last_use_ns = 0
        self.slot: deque[Group] | None = None  # the run queue this group is in, if any

    def backlog(self) -> int:
        """Its messages waiting for delivery, in memory or paged."""
        return (len(self.pending) if self.pending else 0) + (len(self.page) if self.page else 0)

    # ---- transitions (see the module doc) ---------------------------------------------------

    def pin(self, owner: Consumer) -> None:
        """UNOWNED -> OWNED: `owner` gets the group."""
        if self.state != UNOWNED:
            raise IllegalTransition(self, "pin")
        self.state = OWNED
        self.owner = owner
        owner.groups.add(self)

    def detach(self) -> None:
        """OWNED -> DETACHING: deliver nothing more; unpinned once nothing is outstanding."""
        if self.state & OWNERSHIP != OWNED:
            raise IllegalTransition(self, "detach")
        self.state = DETACHING | (self.state & HELD)
        self.slot = None  # its entry in the owner's run queue goes stale

    def unpin(self) -> None:
        """OWNED or DETACHING -> UNOWNED: the group is free for any consumer."""
        owner = self.owner
        if owner is None or not self.state & OWNERSHIP:
            raise IllegalTransition(self, "unpin")
        owner.groups.discard(self)
        self.owner = None
        self.state &= HELD

    def hold(self) -> None:
        """s -> s + HELD: deliver nothing more until `unhold`."""
        if self.state & HELD:
            raise IllegalTransition(self, "hold")
        self.state |= HELD
        self.slot = None  # its entry in a run queue goes stale

    def unhold(self) -> None:
        """s + HELD -> s."""
        if not self.state & HELD:
            raise IllegalTransition(self, "unhold")
        self.state &= OWNERSHIP


def by_key(groups: Iterable[Group]) -> list[Group]:
    """Groups in key order: a set of groups iterates by address, and dispatch is deterministic."""
    return sorted(groups, key=_key)


def _key(g: Group) -> str:
    return g.key


class Consumer:
    __slots__ = (
        "acked", "closed", "delivered", "dirty", "groups", "id", "name", "prefetch", "progress_ns",
        "ready", "stalled", "unacked",
    )  # fmt: skip

    def __init__(self, consumer_id: str, name: str, prefetch: int, now_ns: int) -> None:
        self.id = consumer_id
        self.name = name
        self.prefetch = prefetch
        self.unacked: dict[int, Message] = {}  # delivery id -> message, in delivery order
        self.groups: set[Group] = set()  # the groups it owns
        self.ready: deque[Group] = deque()  # its run queue: owned groups with messages waiting
        self.dirty = False
        self.closed = False
        # Its last settle, or the delivery that ended a spell with nothing unacked: a consumer
        # holding messages without progress for longer than slow-consumer-threshold stalls.
        self.progress_ns = now_ns
        self.stalled = False  # reported as stalled (Effects.stalled) since its last progress
        self.delivered = 0  # deliveries to it, redeliveries included (metrics)
        self.acked = 0
