"""The audit log's contract, defined once: its event kinds, every field, and its file names.

The writer (`broker/audit.py`: nodes, the Python client and so the CLI) builds its lines from
these names, and the checker (`pipeline/history.py`) derives its Spark schema and its known
keys and kinds from them. The contract only grows: a field or kind may be added, never renamed
or retyped, so old logs still read (a checker names the keys and kinds it does not know).

Encoding: one compact JSON object per line (no spaces; `str` as a JSON string, `int` as a
number, `bool` as `true`/`false`); a field whose value would be null is left out.

Node events come from the core's `Effects`: `sent` (added), `delivered` (deliveries),
`acked` (removed while a consumer held it, not dead), `released` (updated: released, or
returned when its consumer went away), `rejected` (dead: rejected or out of delivery
attempts). A message forwarded from another node is `sent` on the node that enqueues it.
`routed` comes from the cluster send path: one per message and target queue on a clustered
address, grouped (`group`, `epoch`, `new_proposal`) or not; the message's `sent` follows, in
the target queue or in the store-and-forward queue (`$sf.`) that carries it to `target`'s
node, with the same `msg_id`. `unbound` is written by the LOCAL node when a binding is
removed: the group may then be bound again, elsewhere, within the same epoch. `moved` is
written by a node that held a group it found bound elsewhere (after a restart, or a removal
of its binding) and sent the group's waiting messages on to `target` (`cluster/claims.py`);
each arrives there as a new `sent` with the same `mid`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

MID_HEADER = "pinmq-mid"  # the end-to-end message id `<producer>/<n>` an auditing client sets

# Segment files: `<writer>-<boot ns>-<k>.jsonl`. `writer` is the node id (or the client's audit
# name), `boot` the writer's start time (a node restarted after a crash writes new files, so
# readers tell its runs apart), `k` grows as segments fill up.
SEGMENT_RE = re.compile(r"^(?P<writer>.+)-(?P<boot>\d+)-(?P<k>\d+)\.jsonl$")


def segment_name(writer: str, boot: int, k: int) -> str:
    """The name of a writer run's `k`th segment (matches `SEGMENT_RE`)."""
    return f"{writer}-{boot}-{k}.jsonl"


class Kind(StrEnum):
    """An event's `kind` (node kinds first, then the client's)."""

    SENT = "sent"  # enqueued here
    ROUTED = "routed"  # the cluster send path chose `target` for a message
    DELIVERED = "delivered"
    ACKED = "acked"  # removed while a consumer held it
    RELEASED = "released"  # released, or returned when its consumer went away
    REJECTED = "rejected"  # rejected, or out of delivery attempts
    UNBOUND = "unbound"  # the LOCAL grouping handler removed a binding (extension)
    MOVED = "moved"  # a held group's message sent on to the group's binding (extension)
    DENIED = "denied"  # a login or an operation refused (security; extension)
    CLIENT_SENT = "client_sent"  # the node confirmed the send
    CLIENT_RECEIVED = "client_received"
    CLIENT_ACKED = "client_acked"


CLIENT_KINDS = (Kind.CLIENT_SENT, Kind.CLIENT_RECEIVED, Kind.CLIENT_ACKED)
KINDS = tuple(Kind)

_ALL = frozenset(Kind)
_MESSAGE = _ALL - {Kind.UNBOUND, Kind.DENIED}  # events about one message
_OWN = _MESSAGE - {Kind.ROUTED}  # the message's own keys (`group_seq`, `producer`)
_HELD = frozenset({Kind.DELIVERED, Kind.ACKED, Kind.RELEASED, Kind.REJECTED})
_CLIENT_HELD = frozenset({Kind.CLIENT_RECEIVED, Kind.CLIENT_ACKED})


@dataclass(frozen=True)
class Field:
    """One key of the events: its name, Python type, meaning and the kinds that carry it.

    `kinds` may carry it (when it has a value: it may be absent from some of them); `required`:
    every event has it, and a line without it is malformed.
    """

    name: str
    type: type[int] | type[str] | type[bool]
    kinds: frozenset[Kind]
    doc: str
    required: bool = False
    key: str = field(init=False, repr=False)  # `,"name":`, as the writer puts it after another

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f',"{self.name}":')


TS_NS = Field("ts_ns", int, _ALL, "wall clock (ns) when the event happened", required=True)
NODE = Field(
    "node", str, _ALL, "node id; client events: the `host:port` the client was connected to",
    required=True,
)  # fmt: skip
EPOCH = Field(
    "epoch", int, frozenset({Kind.ROUTED, Kind.UNBOUND}),
    "the arbiter epoch of the binding that routed the group / was removed",
)  # fmt: skip
KIND = Field("kind", str, _ALL, "what happened (`Kind`)", required=True)
MSG_ID = Field(
    "msg_id", int, _MESSAGE,
    "the message id on that node (a forwarded message gets a new one); `routed`: when known",
)  # fmt: skip
MID = Field(
    "mid", str, _MESSAGE,
    f"end-to-end id `<producer>/<n>` from the `{MID_HEADER}` header (extension)",
)  # fmt: skip
ADDRESS = Field(
    "address", str, _MESSAGE | {Kind.DENIED},
    "where the message was sent; denied: the address of the refused operation (absent: a "
    "login, or an operation on every address)",
)  # fmt: skip
QUEUE = Field(
    "queue", str, _ALL - {Kind.CLIENT_SENT, Kind.DENIED}, "the queue that held the message"
)
GROUP = Field(
    "group", str, _ALL - {Kind.DENIED},
    "resolved group key (absent: ungrouped); `routed`: the group whose binding chose the target",
)  # fmt: skip
GROUP_SEQ = Field("group_seq", int, _OWN, "JMSXGroupSeq (absent: none or 0)")
PRODUCER = Field("producer", str, _OWN, "producer id of an auditing client (from `mid`)")
CONSUMER = Field(
    "consumer", str, _HELD | _CLIENT_HELD,
    "consumer id (as assigned by the node); `released`, `rejected`: when one held it",
)  # fmt: skip
DELIVERY_COUNT = Field(
    "delivery_count", int, (_HELD - {Kind.ACKED}) | {Kind.MOVED, Kind.CLIENT_RECEIVED},
    "delivered, client_received: this delivery's count (1 = first); released, rejected, "
    "moved: the deliveries the message had had",
)  # fmt: skip
N = Field(
    "n", int, _ALL, "the writer's event sequence number, orders equal `ts_ns` (extension)"
)  # fmt: skip
TARGET = Field(
    "target", str, frozenset({Kind.ROUTED, Kind.UNBOUND, Kind.MOVED}),
    "`queue@node`: routed: the chosen one; unbound: the binding's; moved: where the message "
    "went (extension)",
)  # fmt: skip
NEW_PROPOSAL = Field(
    "new_proposal", bool, frozenset({Kind.ROUTED}),
    "routed by a binding: this node proposed a route for the group and awaited the decision, "
    "as its cache or arbiter did not know it (extension)",
)  # fmt: skip
DECISION_NS = Field(
    "decision_ns", int, frozenset({Kind.ROUTED}),
    "routed with a new proposal: time to get the decision (extension)",
)  # fmt: skip
CONSUMER_NAME = Field("consumer_name", str, _CLIENT_HELD, "the consumer's name (extension)")
REASON = Field(
    "reason", str, frozenset({Kind.UNBOUND}),
    "why the binding went: reaped, unbound, instance-deleted, instance-absent (extension)",
)  # fmt: skip
USER = Field(
    "user", str, frozenset({Kind.DENIED, *CLIENT_KINDS}),
    "denied: the user refused (absent: none named); client events: the user the client "
    "authenticated as (extension)",
)  # fmt: skip
PEER = Field("peer", str, frozenset({Kind.DENIED}), "denied: the client's address (extension)")
PERMISSION = Field(
    "permission", str, frozenset({Kind.DENIED}),
    "denied: the permission the user lacks (absent: the login was refused) (extension)",
)  # fmt: skip

# Every field, in the order the writer puts them in a line and the checker's columns.
FIELDS = (
    TS_NS, NODE, EPOCH, KIND, MSG_ID, MID, ADDRESS, QUEUE, GROUP, GROUP_SEQ, PRODUCER, CONSUMER,
    DELIVERY_COUNT, N, TARGET, NEW_PROPOSAL, DECISION_NS, CONSUMER_NAME, REASON, USER, PEER,
    PERMISSION,
)  # fmt: skip
