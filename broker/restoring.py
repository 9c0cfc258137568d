"""Start-up: a node's stored messages back into its queues (mixed into `BrokerCore`).

Two ways in. `restore_messages` places whole messages, as read from any store. `restore_index`
takes only each message's key and group (what SQLite reads without touching a body): a grouped
message stays paged and is read back like any paged message (`broker/pager.py`) once it can
be delivered, so opening a store of a million messages, or an ha backup taking over one,
costs a scan of its index rather than a read of every body.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from broker.addresses import Address
from broker.effects import Effects
from broker.message import Message
from broker.queue import Queue
from broker.store_reads import IndexRow


class Restoring:
    """The core's start-up loads; they run before any client or peer is served."""

    _queues: dict[str, Queue]
    _addresses: dict[str, Address]
    _next_id: int
    paging: set[str]
    _place: Callable[[Queue, Message, int, Effects], None]  # into memory, or paged

    def restore_messages(self, messages: Iterable[Message], next_msg_id: int) -> tuple[int, int]:
        """Reload stored messages (in msg_id order), paging them where their address is full
        under PAGE; returns how many were restored and how many had no queue any more."""
        restored = orphans = 0
        fx = Effects()
        top = next_msg_id
        for m in messages:
            q = self._queues.get(m.queue)
            top = max(top, m.msg_id + 1)
            if q is None:
                orphans += 1
                continue
            restored += 1
            self._place(q, m, m.enqueued_ns, fx)
            self._addresses[q.address].pin(m.group, q.name)
        self._next_id = max(self._next_id, top)
        return restored, orphans

    def restore_index(
        self, rows: Iterable[IndexRow], next_msg_id: int
    ) -> tuple[int, int, dict[str, list[int]]]:
        """Reload stored messages by their index rows (each queue's in msg_id order): grouped
        ones paged, each in the group it was stored under. Returns how many were restored,
        how many had no queue any more, and the msg ids of the ungrouped ones per queue: the
        caller reads and restores those with `restore_messages`, since only messages in
        memory are redistributed to other nodes."""
        restored = orphans = 0
        top = next_msg_id
        ungrouped: dict[str, list[int]] = {}
        queues, addresses = self._queues, self._addresses
        for msg_id, name, group, enqueued_ns in rows:
            if msg_id >= top:
                top = msg_id + 1
            q = queues.get(name)
            if q is None:
                orphans += 1
            elif group is None:
                ungrouped.setdefault(name, []).append(msg_id)
            else:
                restored += 1
                q.restore_paged(msg_id, group, enqueued_ns)
                addresses[q.address].pin(group, name)
        self.paging.update(name for name, q in queues.items() if q.paged)
        self._next_id = max(self._next_id, top)
        return restored, orphans, ungrouped
