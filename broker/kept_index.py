"""The index of a store's messages kept in memory, from the writes that make the store.

An ha backup follows its primary's store write by write (`cluster/replica.py`). Kept here as
it goes, the index a start would scan from the store (`StoreReads.index`: each message's id,
queue, group and time) is at hand when the backup takes over: the promoted process pages its
groups from memory instead of scanning a million rows (`Engine.open`), a run per group, so a
takeover costs a step per group, not per message. It holds no body, no headers: 149 MiB for
a million messages (tracemalloc), under a fifth of what the primary's held messages take
(bench/RESULTS.md).

It changes exactly as the store's `messages` table does (`store_sql.apply`): an add inserts or
replaces its key, a removal deletes it, a deleted queue takes its messages along; delivery
counts, marks and duplicate ids are not part of it.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import Any

from broker.store_reads import IndexRun
from broker.store_writes import STORED_MESSAGE, MessageWrite, QueueDeleted, StoreWrite

_GROUP, _ENQUEUED = STORED_MESSAGE.index("group"), STORED_MESSAGE.index("enqueued_ns")


class KeptIndex:
    """Per queue and group, msg id -> enqueued_ns; per queue, msg id -> group (a removal
    names only the id); and which groups' ids did not all come ascending."""

    def __init__(self) -> None:
        self._groups: dict[str, dict[str | None, dict[int, int]]] = {}
        self._ids: dict[str, dict[int, str | None]] = {}
        self._unordered: set[tuple[str, str | None]] = set()

    def __len__(self) -> int:
        return sum(map(len, self._ids.values()))

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
            for msg_id, queue in record.removed:
                ids = self._ids.get(queue)
                if ids is not None and msg_id in ids:
                    self._remove(queue, ids.pop(msg_id), msg_id)
        elif type(record) is QueueDeleted:
            self._ids.pop(record.queue, None)
            self._groups.pop(record.queue, None)
            self._unordered = {key for key in self._unordered if key[0] != record.queue}

    def runs(self) -> list[IndexRun]:
        """Every message, a run per group in msg id order (`restore_index`)."""
        runs = []
        for queue, groups in self._groups.items():
            for group, held in groups.items():
                ids = array("q", sorted(held) if (queue, group) in self._unordered else held)
                runs.append(IndexRun(queue, group, ids, held[ids[-1]]))
        return runs

    def _add(self, msg_id: int, queue: str, group: str | None, enqueued_ns: int) -> None:
        ids = self._ids.get(queue)
        if ids is None:
            queue = sys.intern(queue)
            ids = self._ids[queue] = {}
            self._groups[queue] = {}
        if group is not None:
            group = sys.intern(group)
        if msg_id in ids:  # a replace
            was = ids[msg_id]
            if was == group:
                self._groups[queue][group][msg_id] = enqueued_ns
                return
            self._remove(queue, was, msg_id)
        ids[msg_id] = group
        groups = self._groups[queue]
        held = groups.get(group)
        if held is None:
            held = groups[group] = {}
        elif msg_id < next(reversed(held)):
            self._unordered.add((queue, group))
        held[msg_id] = enqueued_ns

    def _remove(self, queue: str, group: str | None, msg_id: int) -> None:
        groups = self._groups[queue]
        held = groups[group]
        del held[msg_id]
        if not held:
            del groups[group]
            self._unordered.discard((queue, group))
