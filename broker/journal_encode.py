"""The journal's frames as bytes and as index operations (`broker/journal.py`): what an
append writes, made in one pass, so that the sync applies the operations to the index without
reading its own bytes back (replay decodes them: `JournalIndex._decode`).
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.journal_format import (
    ADD,
    ADD_OP,
    COUNT,
    COUNT_OP,
    DEL,
    DEL_OP,
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
)
from broker.journal_index import IndexOp
from broker.store_writes import Folded, MessageKey, QueueDeleted, QueueSaved, StoreWrite, fold


class JournalEncoding:
    """The encoding part of `Journal` (which holds every attribute used here)."""

    max_id: int
    _order: int
    _messages: dict[MessageKey, list[int]]
    _queues: dict[str, tuple[int, str, str, int, int]]
    _pending: set[MessageKey]  # keys the frame being encoded adds

    def _encode(
        self, records: Iterable[StoreWrite], parts: list[bytes], ops: list[IndexOp]
    ) -> None:
        """The frame's bytes into `parts`, and its operations as the index takes them into
        `ops`: the sync applies those, and never reads the frame back."""
        pos = 0
        self._pending.clear()
        for item in fold(records):
            if type(item) is Folded:
                pos = self._encode_run(item, parts, ops, pos)
                continue
            if type(item) is QueueSaved:
                known = self._queues.get(item.queue)
                order = known[0] if known is not None else self._take_order()
                q, a, s = item.queue.encode(), item.address.encode(), item.settings.encode()
                data = Q_SAVE_OP.pack(Q_SAVE, order, len(q), len(a), len(s)) + q + a + s
                ops.append((Q_SAVE, pos, len(data), item.queue, order, item.address, item.settings))
            else:
                assert type(item) is QueueDeleted
                q = item.queue.encode()
                data = Q_DEL_OP.pack(Q_DEL, len(q)) + q
                ops.append((Q_DEL, pos, len(data), item.queue))
            parts.append(data)
            pos += len(data)

    def _encode_run(self, run: Folded, parts: list[bytes], ops: list[IndexOp], pos: int) -> int:
        """A folded run's operations (see `_encode`); returns the position after them."""
        add, op = parts.append, ops.append
        marks: dict[str, int] = {}
        for origin, seq in run.marks:
            if seq > marks.get(origin, seq - 1):
                marks[origin] = seq
        for origin, seq in marks.items():
            o = origin.encode()
            data = MARK_OP.pack(MARK, seq, len(o)) + o
            op((MARK, pos, len(data), origin, seq))
            add(data)
            pos += len(data)
        stored, pending = self._messages, self._pending
        written = self.max_id  # the highest msg id the index will know once this is synced
        for key, value in run.messages.items():
            if type(value) is tuple:
                pending.add(key)
                msg_id, queue, address, headers, count, group, seq, enqueued, body = value
                written = max(written, msg_id)
                q, a, h = queue.encode(), address.encode(), headers.encode()
                g = b"" if group is None else group.encode()
                names = q + a + h + g
                size = ADD_OP.size + len(names) + len(body)
                op((ADD, pos, size, key, count))
                add(
                    ADD_OP.pack(
                        ADD,
                        msg_id,
                        count,
                        seq,
                        enqueued,
                        len(q),
                        len(a),
                        len(h),
                        -1 if group is None else len(g),
                        len(body),
                    )
                )
                add(names)
                add(body)
                pos += size
                continue
            if key not in stored and key not in pending:
                continue  # added and removed in this frame, or never stored: nothing to do
            q = key[1].encode()
            if value is None:
                data = DEL_OP.pack(DEL, key[0], len(q)) + q
                op((DEL, pos, len(data), key))
            else:
                data = COUNT_OP.pack(COUNT, key[0], value, len(q)) + q
                op((COUNT, pos, len(data), key, value))
            add(data)
            pos += len(data)
        for id_key, msg_id in run.ids.items():
            a, d = id_key[0].encode(), id_key[1].encode()
            if msg_id is None:
                data = ID_FORGET_OP.pack(ID_FORGET, len(a), len(d)) + a + d
                op((ID_FORGET, pos, len(data), id_key))
            else:
                order = self._take_order()
                data = ID_PUT_OP.pack(ID_PUT, order, msg_id, len(a), len(d)) + a + d
                op((ID_PUT, pos, len(data), id_key, order, msg_id))
            add(data)
            pos += len(data)
        if run.highest > written:  # its ADD folded away: ids must still never repeat
            op((MAX_ID, pos, MAX_ID_OP.size, run.highest))
            add(MAX_ID_OP.pack(MAX_ID, run.highest))
            pos += MAX_ID_OP.size
        return pos

    def _take_order(self) -> int:
        order = self._order
        self._order += 1
        return order
