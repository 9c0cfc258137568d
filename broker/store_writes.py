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
from collections.abc import Sequence
from dataclasses import dataclass
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


# One encoder for every message: `json.dumps` with arguments builds one per call, which took
# a third of the encoding's time. ASCII-only output can always be bound as TEXT, so a bad
# header fails the call, not a batch.
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def dumps(value: Any) -> str:
    return _ENCODER.encode(value)
