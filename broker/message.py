"""The message model shared by the core, the store and the servers."""

from __future__ import annotations

from dataclasses import dataclass, field

GROUP_ID_HEADER = "JMSXGroupID"
ALT_GROUP_ID_HEADER = "_AMQ_GROUP_ID"
GROUP_SEQ_HEADER = "JMSXGroupSeq"
# Artemis duplicate detection: a message whose id its address accepted lately is dropped.
DUPLICATE_ID_HEADER = "_AMQ_DUPL_ID"


@dataclass(slots=True)
class Outgoing:
    """A message before a queue holds it: as a client sent it, or as a node forwards it.

    `delivery_count`: deliveries it already had on another node (a group moved between
    nodes), so it stays flagged as a redelivery where it arrives.
    """

    address: str
    body: bytes
    headers: dict[str, str]
    persistent: bool
    delivery_count: int = 0


@dataclass(slots=True)
class Message:
    """One message as held by one queue (multicast copies are separate objects).

    `group` is the resolved group key (after buckets / default group) and is
    set by the queue that holds the message; `None` means ungrouped.
    """

    msg_id: int
    queue: str
    address: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    persistent: bool = False
    delivery_count: int = 0
    group: str | None = None
    group_seq: int = 0
    enqueued_ns: int = 0
    size: int = 0  # bytes it is counted for in memory (broker/budget.py), set when queued

    def outgoing(self) -> Outgoing:
        """The message as it leaves this node's queue for another node's (a moved group)."""
        return Outgoing(self.address, self.body, self.headers, self.persistent, self.delivery_count)

    def copy_for(self, queue: str) -> Message:
        """A copy routed to another queue; the body and headers are shared, not duplicated."""
        return Message(
            msg_id=self.msg_id,
            queue=queue,
            address=self.address,
            body=self.body,
            headers=self.headers,
            persistent=self.persistent,
            delivery_count=self.delivery_count,
            enqueued_ns=self.enqueued_ns,
        )
