"""The journal's bytes (`broker/journal.py`): frames, the operations inside them, and the helpers
that write and check them. Kept apart so that what is on disk reads in one place.

A frame: u32 payload length, u32 CRC-32 of the payload, the payload. A payload: operations,
each a kind byte, its fixed fields (the structs below, little-endian), then its strings
(UTF-8) and body in the order of their lengths.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import zlib
from pathlib import Path

from broker.message import Message
from broker.store_reads import StoreError
from broker.store_writes import MessageKey

FRAME = struct.Struct("<II")  # payload length, CRC-32 of the payload
# Operations: kind byte, fixed fields, then the lengths' UTF-8 strings (body: bytes) in order.
HEAD, ADD, DEL, COUNT, MARK, ID_PUT, ID_FORGET, Q_SAVE, Q_DEL, MAX_ID = range(1, 11)
HEAD_OP = struct.Struct("<BQqQQ")  # segment, store id, max msg id, next order
# msg id, delivery count, group seq, enqueued ns; lengths of queue, address, headers, group
# (-1: none), body
ADD_OP = struct.Struct("<BQIqqIIIiI")
ADD_COUNT_AT = 9  # where an ADD's delivery count lies (rolling rewrites it in place)
DEL_OP = struct.Struct("<BQI")  # msg id; length of queue
COUNT_OP = struct.Struct("<BQII")  # msg id, delivery count; length of queue
MARK_OP = struct.Struct("<BqI")  # seq; length of origin
ID_PUT_OP = struct.Struct("<BQqII")  # order, msg id; lengths of address, duplicate id
ID_FORGET_OP = struct.Struct("<BII")  # lengths of address, duplicate id
Q_SAVE_OP = struct.Struct("<BQIII")  # order; lengths of queue, address, settings
Q_DEL_OP = struct.Struct("<BI")  # length of queue
# the highest msg id taken, when no ADD of it was written (added and removed in one frame)
MAX_ID_OP = struct.Struct("<BQ")


class JournalFull(OSError):
    """The journal reached its `max_bytes`."""

    def __init__(self, path: Path, limit: int) -> None:
        super().__init__(errno.ENOSPC, f"journal at its max size of {limit} bytes", str(path))


HEAD_FRAME_SIZE = FRAME.size + HEAD_OP.size


def bad_frame(view: memoryview, pos: int) -> str | None:
    """What is wrong with the frame at `pos`, or None if it is whole and intact."""
    if len(view) - pos < FRAME.size:
        return "a frame header cut short"
    length, crc = FRAME.unpack_from(view, pos)
    start = pos + FRAME.size
    if length == 0 or start + length > len(view):
        return f"a frame of {length} bytes past the end of the file"
    if zlib.crc32(view[start : start + length]) != crc:
        return "a frame failing its checksum"
    return None


def whole_frame_after(view: memoryview, pos: int) -> bool:
    """Whether an intact frame follows the bad one at `pos` (its header's length taken at its
    word): then the bad frame is damage inside the log, not a write cut short at its end."""
    if len(view) - pos < FRAME.size:
        return False
    length = FRAME.unpack_from(view, pos)[0]
    after = pos + FRAME.size + length
    return length > 0 and after < len(view) and bad_frame(view, after) is None


def op_size(data: memoryview, p: int) -> int:
    kind = data[p]
    if kind == ADD:
        f = ADD_OP.unpack_from(data, p)
        return ADD_OP.size + f[5] + f[6] + f[7] + max(f[8], 0) + f[9]
    if kind == DEL:
        return DEL_OP.size + DEL_OP.unpack_from(data, p)[2]
    if kind == COUNT:
        return COUNT_OP.size + COUNT_OP.unpack_from(data, p)[3]
    if kind == MARK:
        return MARK_OP.size + MARK_OP.unpack_from(data, p)[2]
    if kind == ID_PUT:
        f = ID_PUT_OP.unpack_from(data, p)
        return ID_PUT_OP.size + f[3] + f[4]
    if kind == ID_FORGET:
        f = ID_FORGET_OP.unpack_from(data, p)
        return ID_FORGET_OP.size + f[1] + f[2]
    if kind == Q_SAVE:
        f = Q_SAVE_OP.unpack_from(data, p)
        return Q_SAVE_OP.size + f[2] + f[3] + f[4]
    if kind == Q_DEL:
        return Q_DEL_OP.size + Q_DEL_OP.unpack_from(data, p)[1]
    if kind == HEAD:
        return HEAD_OP.size
    if kind == MAX_ID:
        return MAX_ID_OP.size
    raise StoreError(f"unknown journal operation {kind}")


def add_key(data: memoryview, p: int) -> MessageKey:
    msg_id, lq = ADD_OP.unpack_from(data, p)[1], ADD_OP.unpack_from(data, p)[5]
    q = p + ADD_OP.size
    return msg_id, str(data[q : q + lq], "utf-8")


def decode_add(raw: bytes, count: int) -> tuple[Message, bytes]:
    """A stored message from its ADD operation, with its current delivery count; and its
    headers' JSON text (copies of one message share it)."""
    _, msg_id, _, seq, enqueued, lq, la, lh, lg, lb = ADD_OP.unpack_from(raw, 0)
    p = ADD_OP.size
    queue = raw[p : p + lq].decode()
    p += lq
    address = raw[p : p + la].decode()
    p += la
    headers_text = raw[p : p + lh]
    p += lh
    group = None if lg < 0 else raw[p : p + lg].decode()
    p += max(lg, 0)
    message = Message(
        msg_id=msg_id,
        queue=queue,
        address=address,
        body=raw[p : p + lb],
        headers=json.loads(headers_text),
        persistent=True,
        delivery_count=count,
        group=group,
        group_seq=seq,
        enqueued_ns=enqueued,
    )
    return message, headers_text


# Buffers one writev takes at most (Linux: 1024).
IOV_MAX = os.sysconf("SC_IOV_MAX")


def write_all(fd: int, *parts: bytes) -> None:
    """Write every part, in order, however many calls it takes (no copy of them all)."""
    for i in range(0, len(parts), IOV_MAX):
        chunk = parts[i : i + IOV_MAX]
        written = os.writev(fd, chunk)
        if written < sum(map(len, chunk)):
            rest = memoryview(b"".join(chunk))[written:]
            while rest:
                rest = rest[os.write(fd, rest) :]


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
