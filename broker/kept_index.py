"""The index of a store's messages kept in memory, from the writes that make the store.

An ha backup follows its primary's store write by write (`cluster/replica.py`). Kept here as
it goes, the index a start would scan from the store (`StoreReads.index`: each message's id,
queue, group and time) is at hand when the backup takes over: the promoted process pages its
groups from memory instead of scanning a million rows (`Engine.open`). It holds no body, no
headers: about 185 MiB for a million messages, under a fifth of what the primary's held
messages take (bench/RESULTS.md).

It changes exactly as the store's `messages` table does (`store_sql.apply`): an add inserts or
replaces its key, a removal deletes it, a deleted queue takes its messages along; delivery
counts, marks and duplicate ids are not part of it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import Any

from broker.store_reads import IndexRow
from broker.store_writes import STORED_MESSAGE, MessageWrite, QueueDeleted, StoreWrite

_GROUP, _ENQUEUED = STORED_MESSAGE.index("group"), STORED_MESSAGE.index("enqueued_ns")


class KeptIndex:
    """Per queue, msg id -> (group, enqueued_ns), and whether ids came in ascending order."""

    def __init__(self) -> None:
        self._queues: dict[str, dict[int, tuple[str | None, int]]] = {}
        self._unordered: set[str] = set()  # queues whose ids did not all come ascending

    def __len__(self) -> int:
        return sum(map(len, self._queues.values()))

    def add_rows(self, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Rows of the store's `messages` table, as a snapshot sends them (any order)."""
        i, q, g, e = (columns.index(c) for c in ("msg_id", "queue", "grp", "enqueued_ns"))
        for row in rows:
            self._add(row[i], row[q], row[g], row[e])

    def apply(self, record: StoreWrite) -> None:
        """One store write, as the store applies it: adds, then removals."""
        if type(record) is MessageWrite:
            for row in record.added:
                self._add(row[0], row[1], row[_GROUP], row[_ENQUEUED])
            queues = self._queues
            for msg_id, queue in record.removed:
                held = queues.get(queue)
                if held is not None:
                    held.pop(msg_id, None)
        elif type(record) is QueueDeleted:
            self._queues.pop(record.queue, None)
            self._unordered.discard(record.queue)

    def rows(self) -> Iterator[IndexRow]:
        """Every message's index row, each queue's in msg id order (`restore_index`)."""
        for queue, held in self._queues.items():
            ids = sorted(held) if queue in self._unordered else held
            for msg_id in ids:
                group, enqueued_ns = held[msg_id]
                yield msg_id, queue, group, enqueued_ns

    def _add(self, msg_id: int, queue: str, group: str | None, enqueued_ns: int) -> None:
        held = self._queues.get(queue)
        if held is None:
            held = self._queues[sys.intern(queue)] = {}
        elif msg_id not in held and held and msg_id < next(reversed(held)):
            self._unordered.add(queue)
        held[msg_id] = (None if group is None else sys.intern(group), enqueued_ns)
