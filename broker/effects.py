"""What the pure core hands to the shells: the Effects of an operation (deliveries, messages to
persist, delete or dead-letter, queues created)."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.config import QueueConfig
from broker.message import Message


@dataclass(slots=True, frozen=True)
class Delivery:
    """A message handed to a consumer; `first_in_group` marks the first of a group it owns."""

    delivery_id: int
    consumer_id: str
    message: Message
    first_in_group: bool


@dataclass(slots=True)
class Effects:
    """What an operation asks the shells to do: deliver, persist, delete, dead-letter."""

    deliveries: list[Delivery] = field(default_factory=list)
    added: list[Message] = field(default_factory=list)
    removed: list[Message] = field(default_factory=list)
    updated: list[Message] = field(default_factory=list)
    dead: list[Message] = field(default_factory=list)
    queues_created: list[tuple[str, str, QueueConfig]] = field(default_factory=list)
    # (queue, consumer name, unacked, ns without progress): passed over for new groups
    stalled: list[tuple[str, str, int, int]] = field(default_factory=list)
    # dead messages with nowhere to go, and why: dropped (and logged), not silently
    dropped: list[tuple[Message, str]] = field(default_factory=list)
    # queues that began paging (True) or read their whole page back (False): logged
    paging: list[tuple[str, bool]] = field(default_factory=list)
    # duplicate detection (broker/duplicates.py), in order: ids the store keeps (address, id,
    # msg id) or forgets (msg id None), written in the transaction of the messages
    duplicate_ids: list[tuple[str, str, int | None]] = field(default_factory=list)
    # a client's messages dropped as duplicates: (address, id, the original's msg id or 0)
    duplicates: list[tuple[str, str, int]] = field(default_factory=list)

    def merge(self, other: Effects) -> None:
        """Fold a later operation's effects in, so several operations cost one store write."""
        self.deliveries += other.deliveries
        self.added += other.added
        self.removed += other.removed
        self.updated += other.updated
        self.dead += other.dead
        self.queues_created += other.queues_created
        self.stalled += other.stalled
        self.dropped += other.dropped
        self.paging += other.paging
        self.duplicate_ids += other.duplicate_ids
        self.duplicates += other.duplicates
