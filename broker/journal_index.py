"""The journal's index (`broker/journal.py`): what its segments hold that still lives, and
where. Replaying a segment and syncing a frame both apply the frame's operations here, so the
index after a restart is the index before it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.journal_format import (
    ADD,
    ADD_OP,
    COUNT,
    COUNT_OP,
    DEL,
    DEL_OP,
    HEAD,
    HEAD_OP,
    ID_FORGET,
    ID_FORGET_OP,
    ID_PUT,
    ID_PUT_OP,
    MARK,
    MARK_OP,
    MAX_ID,
    MAX_ID_OP,
    Q_DEL,
    Q_DEL_OP,
    Q_SAVE,
    Q_SAVE_OP,
    add_key,
)
from broker.store_reads import StoreError
from broker.store_writes import IdKey, MessageKey

# One operation of a frame as the index takes it: (kind, position in the frame, size, then
# what the index keeps of it: ADD key count, DEL key, COUNT key count, MARK origin seq,
# ID_PUT key order msg_id, ID_FORGET key, Q_SAVE queue order address settings, Q_DEL queue,
# MAX_ID msg_id, HEAD store_id max_id order). Replay decodes them from a frame's bytes; an
# append makes them with the bytes, so a sync applies them without reading its bytes back.
IndexOp = tuple[Any, ...]


@dataclass(slots=True)
class Segment:
    """One segment file, as the index counts it."""

    number: int
    path: Path
    size: int = 0  # bytes on disk
    live: int = 0  # bytes of operations still needed


class JournalIndex:
    """The state replay builds, and the operations that change it (mixed into `Journal`)."""

    directory: Path
    store_id: int
    max_id: int
    _order: int  # next order number: queues' creation order, duplicate ids' order
    _messages: dict[MessageKey, list[int]]  # key -> [segment, offset, size, count] of its ADD
    _queues: dict[str, tuple[int, str, str, int, int]]  # order, address, settings, seg, offset
    _marks: dict[str, tuple[int, int, int]]  # seq, segment, offset
    _ids: dict[IdKey, tuple[int, int, int, int]]  # order, msg id, segment, offset
    _segments: dict[int, Segment]  # oldest first

    def _index(self, payload: memoryview, segment: int, base: int) -> None:
        """Apply one frame's operations (its bytes, at `base` in `segment`) to the index."""
        self._apply_ops(self._decode(payload, segment, base), segment, base)

    def _decode(self, payload: memoryview, segment: int, base: int) -> list[IndexOp]:
        """A frame's operations as the index takes them (see `IndexOp`)."""
        ops: list[IndexOp] = []
        add = ops.append
        pos, n = 0, len(payload)
        while pos < n:
            kind = payload[pos]
            if kind == ADD:
                _, msg_id, count, _, _, lq, la, lh, lg, lb = ADD_OP.unpack_from(payload, pos)
                p = pos + ADD_OP.size
                size = ADD_OP.size + lq + la + lh + max(lg, 0) + lb
                add((ADD, pos, size, (msg_id, str(payload[p : p + lq], "utf-8")), count))
            elif kind == DEL:
                _, msg_id, lq = DEL_OP.unpack_from(payload, pos)
                p = pos + DEL_OP.size
                size = DEL_OP.size + lq
                add((DEL, pos, size, (msg_id, str(payload[p : p + lq], "utf-8"))))
            elif kind == COUNT:
                _, msg_id, count, lq = COUNT_OP.unpack_from(payload, pos)
                p = pos + COUNT_OP.size
                size = COUNT_OP.size + lq
                add((COUNT, pos, size, (msg_id, str(payload[p : p + lq], "utf-8")), count))
            elif kind == MARK:
                _, seq, lo = MARK_OP.unpack_from(payload, pos)
                p = pos + MARK_OP.size
                size = MARK_OP.size + lo
                add((MARK, pos, size, str(payload[p : p + lo], "utf-8"), seq))
            elif kind == ID_PUT:
                _, order, msg_id, la, ld = ID_PUT_OP.unpack_from(payload, pos)
                p = pos + ID_PUT_OP.size
                size = ID_PUT_OP.size + la + ld
                add((ID_PUT, pos, size, _id_key(payload, p, la, ld), order, msg_id))
            elif kind == ID_FORGET:
                _, la, ld = ID_FORGET_OP.unpack_from(payload, pos)
                p = pos + ID_FORGET_OP.size
                size = ID_FORGET_OP.size + la + ld
                add((ID_FORGET, pos, size, _id_key(payload, p, la, ld)))
            elif kind == Q_SAVE:
                _, order, lq, la, ls = Q_SAVE_OP.unpack_from(payload, pos)
                p = pos + Q_SAVE_OP.size
                size = Q_SAVE_OP.size + lq + la + ls
                queue = str(payload[p : p + lq], "utf-8")
                address = str(payload[p + lq : p + lq + la], "utf-8")
                settings = str(payload[p + lq + la : p + lq + la + ls], "utf-8")
                add((Q_SAVE, pos, size, queue, order, address, settings))
            elif kind == Q_DEL:
                _, lq = Q_DEL_OP.unpack_from(payload, pos)
                p = pos + Q_DEL_OP.size
                size = Q_DEL_OP.size + lq
                add((Q_DEL, pos, size, str(payload[p : p + lq], "utf-8")))
            elif kind == MAX_ID:
                size = MAX_ID_OP.size
                add((MAX_ID, pos, size, MAX_ID_OP.unpack_from(payload, pos)[1]))
            elif kind == HEAD:
                _, _, store_id, max_id, order = HEAD_OP.unpack_from(payload, pos)
                size = HEAD_OP.size
                add((HEAD, pos, size, store_id, max_id, order))
            else:
                raise StoreError(
                    f"{self.directory}: unknown operation {kind} in segment {segment} at "
                    f"{base + pos}"
                )
            pos += size
        return ops

    def _apply_ops(self, ops: list[IndexOp], segment: int, base: int) -> None:
        """Apply a frame's operations, written at `base` in `segment`, to the index."""
        segments, messages = self._segments, self._messages
        written = segments[segment]
        for op in ops:
            kind, pos, size = op[0], op[1], op[2]
            if kind == ADD:
                key, count = op[3], op[4]
                old = messages.get(key)
                if old is not None:
                    segments[old[0]].live -= old[2]
                messages[key] = [segment, base + pos, size, count]
                written.live += size
                if key[0] > self.max_id:
                    self.max_id = key[0]
            elif kind == DEL:
                old = messages.pop(op[3], None)
                if old is not None:
                    segments[old[0]].live -= old[2]
            elif kind == COUNT:
                entry = messages.get(op[3])
                if entry is not None:
                    entry[3] = op[4]
            elif kind == MARK:
                origin, seq = op[3], op[4]
                old_mark = self._marks.get(origin)
                if old_mark is None or seq >= old_mark[0]:  # equal: the same, rolled
                    if old_mark is not None:
                        segments[old_mark[1]].live -= size
                    self._marks[origin] = (seq, segment, base + pos)
                    written.live += size
            elif kind == ID_PUT:
                id_key, order = op[3], op[4]
                self._drop_id(id_key)
                self._ids[id_key] = (order, op[5], segment, base + pos)
                written.live += size
                self._order = max(self._order, order + 1)
            elif kind == ID_FORGET:
                self._drop_id(op[3])
            elif kind == Q_SAVE:
                queue, order = op[3], op[4]
                old_q = self._queues.get(queue)
                if old_q is not None:
                    segments[old_q[3]].live -= _q_size(old_q)
                self._queues[queue] = (order, op[5], op[6], segment, base + pos)
                written.live += size
                self._order = max(self._order, order + 1)
            elif kind == Q_DEL:
                queue = op[3]
                old_q = self._queues.pop(queue, None)
                if old_q is not None:
                    segments[old_q[3]].live -= _q_size(old_q)
                for key in [k for k in messages if k[1] == queue]:
                    old = messages.pop(key)
                    segments[old[0]].live -= old[2]
            elif kind == MAX_ID:
                self.max_id = max(self.max_id, op[3])
            else:  # HEAD
                if not self.store_id:
                    self.store_id = op[3]
                self.max_id = max(self.max_id, op[4])
                self._order = max(self._order, op[5])

    def _drop_id(self, key: IdKey) -> None:
        old = self._ids.pop(key, None)
        if old is not None:
            self._segments[old[2]].live -= (
                ID_PUT_OP.size + len(key[0].encode()) + len(key[1].encode())
            )

    # ------------------------------------------------------------------ reading

    def load_queues(self) -> list[tuple[str, str, dict]]:
        rows = sorted(self._queues.items(), key=lambda item: item[1][0])
        return [
            (address, name, json.loads(settings)) for name, (_, address, settings, _, _) in rows
        ]

    def message_count(self) -> int:
        return len(self._messages)

    def load_marks(self) -> dict[str, int]:
        return {origin: seq for origin, (seq, _, _) in self._marks.items()}

    def load_ids(self) -> list[tuple[str, str, int]]:
        rows = sorted(self._ids.items(), key=lambda item: item[1][0])
        return [(address, dup_id, msg_id) for (address, dup_id), (_, msg_id, _, _) in rows]

    def _is_live(self, kind: int, data: memoryview, p: int, number: int) -> bool:
        """Whether the index still points at the operation at `p` of segment `number`."""
        # The index holds offsets within the segment file: `p` is one too.
        if kind == ADD:
            entry = self._messages.get(add_key(data, p))
            return entry is not None and entry[0] == number and entry[1] == p
        if kind == Q_SAVE:
            lq = Q_SAVE_OP.unpack_from(data, p)[2]
            q = p + Q_SAVE_OP.size
            found = self._queues.get(str(data[q : q + lq], "utf-8"))
            return found is not None and found[3] == number and found[4] == p
        if kind == MARK:
            lo = MARK_OP.unpack_from(data, p)[2]
            o = p + MARK_OP.size
            mark = self._marks.get(str(data[o : o + lo], "utf-8"))
            return mark is not None and mark[1] == number and mark[2] == p
        if kind == ID_PUT:
            la, ld = ID_PUT_OP.unpack_from(data, p)[3:5]
            a = p + ID_PUT_OP.size
            key = (str(data[a : a + la], "utf-8"), str(data[a + la : a + la + ld], "utf-8"))
            found_id = self._ids.get(key)
            return found_id is not None and found_id[2] == number and found_id[3] == p
        return False


def _q_size(entry: tuple[int, str, str, int, int]) -> int:
    return Q_SAVE_OP.size + len(entry[1].encode()) + len(entry[2].encode())


def _id_key(payload: memoryview, p: int, la: int, ld: int) -> IdKey:
    """The (address, duplicate id) an ID_PUT or ID_FORGET names, its text at `p`."""
    return str(payload[p : p + la], "utf-8"), str(payload[p + la : p + la + ld], "utf-8")
