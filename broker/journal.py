"""The journal store's files: an append-only log of store operations in segment files, and the
index that replaying it builds. Used by one writer thread (`broker/journal_store.py`); reads may
come from any thread.

Why a journal
    Measured on a two-core machine (bench/RESULTS.md, issue 29), SQLite's writer thread took 18 %
    (STOMP) to 31 % (gRPC) of a node's CPU on persistent grouped messages: a B-tree insert,
    update and delete per message, each page written to the WAL and again by checkpoints. A
    broker's messages live briefly and are read back only at start-up or when paged, so
    appending each operation once and dropping whole files once nothing in them is live does
    the same job for a fraction of the CPU.

Format
    A directory of segment files `00000001.seg`, `00000002.seg`, ... Each holds frames: a u32
    payload length, the payload's u32 CRC-32, then the payload, a run of operations (kinds
    below), each starting with its kind byte. A frame is one group commit, applied whole or not
    at all. Every segment begins with a HEAD frame (store id, segment number, the highest msg id
    and the next order number so far), so no older segment is needed to know them.

Replay and crashes
    Opening replays every segment in order into the index: what is live and where it lies. A
    frame cut short or failing its CRC at the end of the last segment is a write a crash
    interrupted, never acknowledged: it is cut off, with a warning. Anywhere else it is
    corruption, and the store is refused, naming the file and the offset; nothing is changed.

Rolling segments (compaction)
    Only the oldest segment is ever removed: its live operations (messages with their current
    delivery count, queue definitions, marks, duplicate ids) are appended again at the head and
    synced, then the file is deleted. Removing only the oldest is what keeps a removal from
    being lost: an operation in the oldest segment can only cancel an add in that segment. With
    messages consumed in order the oldest segment is usually all dead, and rolling it is an
    unlink. A segment is rolled when it is all dead, or when the dead bytes of the journal
    outweigh both its live bytes and one segment.

Memory: the index keeps about 150 bytes per stored message (its key, where it lies, its count).
"""

from __future__ import annotations

import os
import random
import struct
import threading
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import structlog

from broker.journal_encode import JournalEncoding
from broker.journal_format import (
    ADD,
    ADD_COUNT_AT,
    FRAME,
    HEAD,
    HEAD_FRAME_SIZE,
    HEAD_OP,
    JournalFull,
    add_key,
    bad_frame,
    decode_add,
    fsync_dir,
    op_size,
    whole_frame_after,
    write_all,
)
from broker.journal_index import IndexOp, JournalIndex, Segment
from broker.message import Message
from broker.store_reads import StoreError
from broker.store_writes import (
    MessageKey,
    StoreWrite,
)

log = structlog.get_logger(__name__)

SEGMENT_BYTES = 32 * 1024 * 1024
ROLL_FRAME_BYTES = 4 * 1024 * 1024  # rolled operations go out in frames of about this size
SUFFIX = ".seg"


class Journal(JournalIndex, JournalEncoding):
    """The segments of one journal directory and the index replaying them builds.

    `append` and `roll` are for one writer thread; `messages`, `read_ids` and the `load_*`
    calls may come from any thread.
    """

    def __init__(self, directory: Path, segment_bytes: int, max_bytes: int | None) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        self.store_id = 0
        self.max_id = 0
        self._order = 1
        self._messages = {}  # the index (its fields: JournalIndex)
        self._queues = {}
        self._marks = {}
        self._ids = {}
        self._segments = {}
        self._next = 1  # the number of the first segment, when there is none yet
        self._pending: set[MessageKey] = set()  # added by the frame being encoded
        self._fd = -1  # the head segment, open for appending
        self._readers: dict[int, int] = {}  # segment -> fd for reads
        self._lock = threading.Lock()  # readers' fds against a segment's removal
        self._broken: str | None = None  # why no write may follow (a failed sync)

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        segment_bytes: int = SEGMENT_BYTES,
        max_bytes: int | None = None,
    ) -> Journal:
        """Replay the journal in `directory` (created if missing) and open its head for
        appending. Raises `StoreError` naming the file if it is not an intact journal."""
        journal = cls(directory, segment_bytes, max_bytes)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{directory}: cannot create the directory: {exc}") from exc
        if not directory.is_dir():
            raise StoreError(f"{directory}: exists but is not a directory")
        try:
            journal._replay()
            journal._open_head()
        except OSError as exc:
            journal.close()
            raise StoreError(f"{directory}: cannot open the journal: {exc}") from exc
        except StoreError:
            journal.close()
            raise
        return journal

    def _replay(self) -> None:
        names = [p for p in self.directory.iterdir() if p.suffix == SUFFIX]
        for path in names:
            if not path.stem.isdigit() or not path.is_file():
                raise StoreError(f"{path}: not a journal segment (expected NNNNNNNN{SUFFIX})")
        names.sort(key=lambda p: int(p.stem))
        numbers = [int(p.stem) for p in names]
        for i, (number, path) in enumerate(zip(numbers, names, strict=True)):
            last = i == len(names) - 1
            data = path.read_bytes()
            end = self._replay_segment(number, path, data, last)
            if end < len(data):  # a torn write at the tail of the last segment
                log.warning(
                    "journal: cut off a write a crash interrupted",
                    path=str(path),
                    offset=end,
                    bytes=len(data) - end,
                )
                with open(path, "rb+") as f:
                    f.truncate(end)
                    os.fsync(f.fileno())
            if end == 0:  # nothing whole in it: a segment the crash caught being created
                if not last:
                    raise StoreError(f"{path}: journal segment is empty; refusing to use it")
                path.unlink()
                del self._segments[number]
                self._next = number
        if not self.store_id:
            self.store_id = random.getrandbits(62) or 1

    def _replay_segment(self, number: int, path: Path, data: bytes, last: bool) -> int:
        """Index the whole frames of one segment; returns where they end."""
        segment = self._segments[number] = Segment(number, path)
        view = memoryview(data)
        pos, n = 0, len(data)
        while pos < n:
            bad = bad_frame(view, pos)
            if bad is not None:
                if pos == 0 and n > HEAD_FRAME_SIZE:  # more than a head a crash cut short
                    raise StoreError(f"{path}: not a journal segment ({bad} at its start)")
                if last and not whole_frame_after(view, pos):
                    break
                raise StoreError(
                    f"{path}: journal is corrupt at offset {pos}: {bad}; refusing to use it"
                )
            length = FRAME.unpack_from(view, pos)[0]
            start = pos + FRAME.size
            if pos == 0 and view[start] != HEAD:
                raise StoreError(f"{path}: not a journal segment (no head frame)")
            self._index(view[start : start + length], number, start)
            pos = start + length
        segment.size = pos
        return pos

    def _open_head(self) -> None:
        if self._segments:
            head = next(reversed(self._segments.values()))
            self._fd = os.open(head.path, os.O_WRONLY | os.O_APPEND)
        else:
            self._new_segment(self._next)
            fsync_dir(self.directory.parent)  # the journal directory's own entry

    # ------------------------------------------------------------------ writing

    def append(self, records: Sequence[StoreWrite]) -> None:
        """Write records in call order as one frame and sync it; on failure nothing of them
        stays (in the file or the index) and the error is raised."""
        if self._broken is not None:
            raise StoreError(f"{self.directory}: journal is unusable after {self._broken}")
        parts: list[bytes] = []
        ops: list[IndexOp] = []
        self._encode(records, parts, ops)
        if parts:
            self._write_frame(parts, ops)

    def _write_frame(
        self, parts: list[bytes], ops: list[IndexOp] | None, capped: bool = True
    ) -> None:
        """Append one frame (its payload in `parts`, written as they are) to the head segment
        (a new one if it is full), sync, index it; `ops`: its operations as the index takes
        them (None: decoded from its bytes); `capped`: refused beyond `max_bytes`."""
        length = sum(map(len, parts))
        frame_size = FRAME.size + length
        head = next(reversed(self._segments.values()))
        if head.size + frame_size > self.segment_bytes and head.size > HEAD_FRAME_SIZE:
            head = self._new_segment(head.number + 1)
        if (
            capped
            and self.max_bytes is not None
            and self.disk_bytes() + frame_size > self.max_bytes
        ):
            raise JournalFull(self.directory, self.max_bytes)
        crc = 0
        for part in parts:
            crc = zlib.crc32(part, crc)
        start = head.size
        try:
            write_all(self._fd, FRAME.pack(length, crc), *parts)
        except OSError:
            self._cut(head, start)
            raise
        try:
            os.fdatasync(self._fd)
        except OSError as exc:
            # What the page cache holds after a failed sync is not known to be on disk, nor
            # will a retry tell: nothing more may be written.
            self._broken = f"a failed sync of {head.path} ({exc})"
            raise
        head.size = start + frame_size
        base = start + FRAME.size
        if ops is None:
            self._index(memoryview(b"".join(parts)), head.number, base)
        else:
            self._apply_ops(ops, head.number, base)

    def _cut(self, head: Segment, size: int) -> None:
        """Take a part-written frame off the end of the head segment."""
        try:
            os.ftruncate(self._fd, size)
        except OSError as exc:
            self._broken = f"a failed write to {head.path} that could not be cut off ({exc})"

    def _new_segment(self, number: int) -> Segment:
        path = self.directory / f"{number:08d}{SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        segment = self._segments[number] = Segment(number, path)
        payload = HEAD_OP.pack(HEAD, number, self.store_id, self.max_id, self._order)
        frame = FRAME.pack(len(payload), zlib.crc32(payload))
        try:
            write_all(fd, frame, payload)
            os.fsync(fd)
            fsync_dir(self.directory)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            del self._segments[number]
            raise
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        segment.size = HEAD_FRAME_SIZE
        return segment

    # ------------------------------------------------------------------ rolling

    def segment_count(self) -> int:
        return len(self._segments)

    def dead_bytes(self) -> int:
        return sum(s.size - s.live for s in self._segments.values())

    def roll_due(self, wanted: bool = False) -> bool:
        """Whether the oldest segment should be rolled: it is all dead, or the journal's dead
        bytes outweigh its live bytes and one segment; with `wanted` (the disk is tight),
        whenever an eighth of a segment in it is dead."""
        if len(self._segments) < 2:
            return False
        oldest = next(iter(self._segments.values()))
        if oldest.live <= 0:
            return True
        if wanted:  # not for the frames' own few bytes: a rolled segment has those too
            return oldest.size - oldest.live > self.segment_bytes // 8
        live = sum(s.live for s in self._segments.values())
        return self.dead_bytes() > max(live, self.segment_bytes)

    def roll(self) -> None:
        """Append the oldest segment's live operations at the head, sync, delete the file."""
        if self._broken is not None:
            raise StoreError(f"{self.directory}: journal is unusable after {self._broken}")
        oldest = next(iter(self._segments.values()))
        if oldest.live > 0:
            data = oldest.path.read_bytes()[: oldest.size]
            chunk: list[bytes] = []
            size = 0
            for op in self._live_ops(oldest.number, memoryview(data)):
                chunk.append(op)
                size += len(op)
                if size >= ROLL_FRAME_BYTES:
                    self._write_frame(chunk, None, capped=False)
                    chunk, size = [], 0
            if chunk:
                self._write_frame(chunk, None, capped=False)
        with self._lock:
            fd = self._readers.pop(oldest.number, None)
            if fd is not None:
                os.close(fd)
            oldest.path.unlink()
            del self._segments[oldest.number]
        fsync_dir(self.directory)

    def _live_ops(self, number: int, data: memoryview) -> Iterator[bytes]:
        """The operations of segment `number` (its bytes) that the index still points at, as
        they must be written again; an ADD carries its current delivery count."""
        pos = 0
        while pos < len(data):
            length = FRAME.unpack_from(data, pos)[0]
            start = pos + FRAME.size
            p, end = start, start + length
            while p < end:
                kind = data[p]
                size = op_size(data, p)
                if self._is_live(kind, data, p, number):
                    op = bytearray(data[p : p + size])
                    if kind == ADD:
                        key = add_key(data, p)
                        struct.pack_into("<I", op, ADD_COUNT_AT, self._messages[key][3])
                    yield bytes(op)
                p += size
            pos = end

    # ------------------------------------------------------------------ reading

    def messages(self) -> Iterator[Message]:
        """Every stored message ordered by (msg_id, queue); copies share headers and body."""
        last: tuple[int, bytes, dict[str, str], bytes] | None = None
        for key in sorted(self._messages):
            found = self._read(key)
            if found is None:
                continue
            message, headers_text = decode_add(*found)
            if last is not None and last[0] == message.msg_id and last[1] == headers_text:
                message.headers = last[2]
                if last[3] == message.body:
                    message.body = last[3]
            last = (message.msg_id, headers_text, message.headers, message.body)
            yield message

    def read_ids(self, queue: str, wanted: Sequence[Sequence[int]]) -> list[list[Message]]:
        pages: list[list[Message]] = []
        for ids in wanted:
            page: list[Message] = []
            for msg_id in sorted(ids):
                found = self._read((msg_id, queue))
                if found is not None:
                    page.append(decode_add(*found)[0])
            pages.append(page)
        return pages

    def _read(self, key: MessageKey) -> tuple[bytes, int] | None:
        """A stored message's ADD operation and its delivery count; None if not stored."""
        while True:
            entry = self._messages.get(key)
            if entry is None:
                return None
            number, offset, size, count = entry
            with self._lock:  # a roll deletes a segment under it: then the key has moved
                segment = self._segments.get(number)
                if segment is None:
                    continue
                fd = self._readers.get(number)
                if fd is None:
                    fd = self._readers[number] = os.open(segment.path, os.O_RDONLY)
                raw = os.pread(fd, size, offset)
            if len(raw) != size:
                raise StoreError(f"{segment.path}: short of a message at offset {offset}")
            return raw, count

    def disk_bytes(self) -> int:
        return sum(s.size for s in self._segments.values())

    def close(self) -> None:
        with self._lock:
            for fd in self._readers.values():
                os.close(fd)
            self._readers.clear()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
