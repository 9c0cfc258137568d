"""Start-up: a node's stored messages back into its queues (mixed into `BrokerCore`).

Two ways in. `restore_messages` places whole messages, as read from any store. `restore_index`
takes only their keys, a run per group (what SQLite reads without touching a body, or what an
ha backup kept while following): a grouped message stays paged and is read back like any
paged message (`broker/pager.py`) once it can be delivered, so opening a store of a million
messages costs a scan of its index rather than a read of every body, and a takeover from a
kept index a step per group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from broker.addresses import Address
from broker.effects import Effects
from broker.message import Message
from broker.queue import Queue
from broker.store_reads import IndexRun


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
        self, runs: Iterable[IndexRun], next_msg_id: int
    ) -> tuple[int, int, dict[str, list[int]]]:
        """Reload stored messages by their index, a run per group: grouped ones paged, each
        in the group it was stored under. Returns how many were restored, how many had no
        queue any more, and the msg ids of the ungrouped ones per queue: the caller reads and
        restores those with `restore_messages`, since only messages in memory are
        redistributed to other nodes."""
        restored = orphans = 0
        top = next_msg_id
        ungrouped: dict[str, list[int]] = {}
        queues, addresses = self._queues, self._addresses
        for name, group, msg_ids, enqueued_ns in runs:
            top = max(top, msg_ids[-1] + 1)
            q = queues.get(name)
            if q is None:
                orphans += len(msg_ids)
            elif group is None:
                ungrouped[name] = msg_ids.tolist()
            else:
                restored += len(msg_ids)
                q.restore_paged(group, msg_ids, enqueued_ns)
                addresses[q.address].pin(group, name)
        self.paging.update(name for name, q in queues.items() if q.paged)
        self._next_id = max(self._next_id, top)
        return restored, orphans, ungrouped
