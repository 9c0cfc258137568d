"""What the message store writes, as records: the public form of its write requests.

`Store.write`, `save_queue` and `delete_queue` turn their arguments into one record each at call
time (a `Message` is mutable: what is stored is what it held then), the writer thread applies
the records in call order (`store_sql.apply`), and ha replication hands the same records to the
backup, whose store applies them with `Store.apply`. They are what the store promises to
replication: `cluster/replication_wire.py` puts them on the wire, field by field, in an order
of its own that it checks against theirs; how the writer thread batches them stays private.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from json.encoder import c_make_encoder, encode_basestring_ascii
from typing import Any, ClassVar

from broker.message import Message

# What a write holds, as tuples (one per stored message, key, count...): every send and ack
# makes some, so they are plain tuples, their fields named in the tuple that follows each.

# A persistent message as stored: a row of the `messages` table, in its column order. Its
# headers are a JSON object (ASCII only).
StoredMessage = tuple[int, str, str, str, int, str | None, int, int, bytes]
STORED_MESSAGE = (
    "msg_id",
    "queue",
    "address",
    "headers",
    "delivery_count",
    "group",
    "group_seq",
    "enqueued_ns",
    "body",
)
# One stored message: multicast copies share a msg id, one per queue.
MessageKey = tuple[int, str]
MESSAGE_KEY = ("msg_id", "queue")
# A stored message's new delivery count.
DeliveryCount = tuple[int, int, str]
DELIVERY_COUNT = ("count", "msg_id", "queue")
# A forwarding high-water mark: the highest sequence from an origin stored here (only ever
# raised: a lower one than the stored one changes nothing).
Mark = tuple[str, int]
MARK = ("origin", "seq")
# A duplicate-detection id of an address: kept for its msg id (the newest), or forgotten (None).
DuplicateId = tuple[str, str, int | None]
DUPLICATE_ID = ("address", "dup_id", "msg_id")


@dataclass(slots=True)  # not frozen, which costs 0.4 µs more per write; none changes once made
class MessageWrite:
    """One `Store.write`: applied as one, adds first, then counts, then removals; marks and
    duplicate ids in the same transaction."""

    added: Sequence[StoredMessage] = ()
    removed: Sequence[MessageKey] = ()
    counts: Sequence[DeliveryCount] = ()
    marks: Sequence[Mark] = ()
    ids: Sequence[DuplicateId] = ()

    @property
    def size(self) -> int:
        """Operations it holds: what counts toward the writer's batch bound."""
        return (
            len(self.added) + len(self.removed) + len(self.counts) + len(self.marks) + len(self.ids)
        )


@dataclass(frozen=True, slots=True)
class QueueSaved:
    """A queue definition created or replaced; `settings` is a JSON object."""

    queue: str
    address: str
    settings: str
    size: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class QueueDeleted:
    """A queue definition removed with every message stored for it."""

    queue: str
    size: ClassVar[int] = 1


StoreWrite = MessageWrite | QueueSaved | QueueDeleted

IdKey = tuple[str, str]  # (address, duplicate id)
_COUNT = STORED_MESSAGE.index("delivery_count")


@dataclass(slots=True)
class Folded:
    """The net effect of a run of message writes, as every store applies it.

    Operations on one (msg_id, queue) fold to their net effect: an add and a remove become a
    delete of nothing, an add and a count an add with that count. Keys are distinct, so the
    order between them is free; ids keep their order (newest last).
    """

    messages: dict[MessageKey, StoredMessage | int | None] = field(default_factory=dict)
    ids: dict[IdKey, int | None] = field(default_factory=dict)  # msg id: keep; None: forget
    marks: list[Mark] = field(default_factory=list)
    highest: int = 0  # the highest msg id added


def fold(writes: Iterable[StoreWrite]) -> Iterator[Folded | QueueSaved | QueueDeleted]:
    """Writes in call order as folded runs of message writes, split by the queue operations
    (which see every earlier write applied)."""
    run: Folded | None = None
    for write in writes:
        if type(write) is not MessageWrite:
            if run is not None:
                yield run
                run = None
            yield write  # type: ignore[misc]
            continue
        if run is None:
            run = Folded()
        run.marks.extend(write.marks)
        ids = run.ids
        for address, dup_id, msg_id in write.ids:
            ids.pop((address, dup_id), None)  # re-inserted: in order again
            ids[(address, dup_id)] = msg_id
        net = run.messages
        for row in write.added:
            net[(row[0], row[1])] = row
            if row[0] > run.highest:
                run.highest = row[0]
        for count, msg_id, queue_ in write.counts:
            key = (msg_id, queue_)
            current = net.get(key, 0)
            if type(current) is tuple:
                net[key] = (*current[:_COUNT], count, *current[_COUNT + 1 :])
            elif current is not None:  # a count after a delete stays deleted
                net[key] = count
        for key in write.removed:
            net[key] = None
    if run is not None:
        yield run


def stored(messages: Sequence[Message]) -> list[StoredMessage]:
    """Persistent messages as stored, snapshotted now on the caller's thread."""
    rows: list[StoredMessage] = []
    encoded: dict[int, str] = {}  # multicast copies share one headers dict: encode it once
    for m in messages:
        if not m.persistent:
            continue
        headers = m.headers
        if headers:
            text = encoded.get(id(headers))
            if text is None:
                text = encoded[id(headers)] = dumps(headers)
        else:
            text = "{}"
        body = m.body if type(m.body) is bytes else bytes(m.body)
        rows.append(
            (
                m.msg_id,
                m.queue,
                m.address,
                text,
                m.delivery_count,
                m.group,
                m.group_seq,
                m.enqueued_ns,
                body,
            )
        )
    return rows


# One encoder, built once, for every message: `json.dumps` builds one per call, and even a kept
# `JSONEncoder` builds its C encoder per call (half of a small dict's 1.4 µs). ASCII-only
# output can always be bound as TEXT, so a bad header fails the call, not a batch. No check
# for circular references: what is stored is headers and queue settings, never circular.
_ENCODE = c_make_encoder(
    None, json.JSONEncoder().default, encode_basestring_ascii, None, ":", ",", False, False, True
)


def dumps(value: Any) -> str:
    return "".join(_ENCODE(value, 0))
