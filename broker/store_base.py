"""What every message store format shares: durable writes through one writer thread with group
commit, the disk-full wait, and the calls the engine, paging, replication and /metrics use.

Why group commit on one writer thread
    The fsync, not the encoding, is the cost of a durable write. Every `write()` queues its
    record and waits; the writer thread takes everything queued (up to `MAX_BATCH_OPS`
    operations), applies it in call order as ONE durable transaction, then resolves the waiting
    futures in call order. While it is syncing, new calls pile up and form the next batch, so
    throughput grows with concurrency instead of being one fsync per message. The event loop
    never touches the disk: it only turns each call into a write record
    (`broker/store_writes.py`) and enqueues it.

Failures
    A failed transaction (disk full, I/O error) leaves nothing of its batch behind and the
    futures of that batch are rejected with `StoreError`; when a batch of several calls fails,
    each call is retried alone so one bad call cannot fail others. With `on_full`, a write that
    finds no room waits and retries instead (see `StoreBase.__init__`).

The formats: `broker/store.py` (one SQLite file, the default) and `broker/journal_store.py`
(an append-only journal, `store.format: journal`).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Generic, TypeVar

import structlog

from broker import sqlite_file
from broker.histogram import Histogram
from broker.message import Message
from broker.sqlite_file import Request, Requests
from broker.store_reads import IndexRun, StoreClosed, StoreError
from broker.store_writes import MessageWrite, QueueDeleted, QueueSaved, StoreWrite, dumps, stored

log = structlog.get_logger(__name__)
_NO_MARKS: Mapping[str, int] = MappingProxyType({})

MAX_BATCH_OPS = 5000
FULL_RETRY_S = 0.2  # how often a write that found the disk full tries again
# /metrics' buckets: a commit's time in ns (an fsync takes from 0.1 ms to tens of ms), and the
# operations of a batch (one to MAX_BATCH_OPS).
COMMIT_BOUNDS_NS = tuple(int(ms * 1_000_000) for ms in (0.25, 0.5, 1, 2.5, 5, 10, 25, 100, 1000))
BATCH_BOUNDS = (1, 4, 16, 64, 256, 1024, MAX_BATCH_OPS)

# Request kinds handled by the writer thread: a `StoreWrite` record, or the close.
WRITE, CLOSE = range(2)

Handle = TypeVar("Handle")  # what the writer thread writes through: a connection, a journal


class StoreBase(ABC, Generic[Handle]):
    """Persistent messages, queue definitions, marks and duplicate ids of one node.

    The sync `load_*` / `messages` / `max_msg_id` calls are for start-up; the async calls are
    durable when they resolve. Cancelling a waiting `write()` does not cancel the write.
    `commits` and `compactions` count transactions and compaction runs.

    With `on_full` (called on the writer thread; it frees space and says whether it did), a
    write that finds the disk full is retried instead of failing: at once if `on_full` freed
    something, else every `FULL_RETRY_S` until it fits or the store closes. Nothing
    acknowledged is ever dropped for want of space, and acks wait rather than fail.
    """

    TABLES: tuple[str, ...] = ()  # what a backup copies (ha replication)

    def __init__(self, path: Path, on_full: Callable[[], bool] | None = None) -> None:
        self.path = path
        self.commits = 0
        # For /metrics, kept by the writer thread: each transaction's time (the sync
        # included) and the operations it carried.
        self.commit_ns = Histogram(COMMIT_BOUNDS_NS)
        self.batch_ops = Histogram(BATCH_BOUNDS)
        self.compactions = 0
        self.waiting_for_space = False  # a write found the disk full and waits to retry
        self.free_bytes = 0  # room inside the store's files for new messages, not yet the OS's
        self._on_full = on_full
        self._requests: Requests = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._compaction_wanted = False
        self._failing = False  # writes fail (logged once) until one succeeds again
        # ha: the primary's replication sees every write record here, in call order
        self.tap: sqlite_file.Tap[StoreWrite] | None = None

    def _start(self, connect: Callable[[], Handle]) -> None:
        self._thread = sqlite_file.start_writer(
            f"store-writer:{self.path.name}", connect, self._serve
        )

    # ------------------------------------------------------------------ reads

    def load_messages(self) -> list[Message]:
        """Every stored message ordered by (msg_id, queue), with its latest delivery count."""
        return list(self.messages())

    @abstractmethod
    def messages(self) -> Iterator[Message]:
        """`load_messages` one at a time, so a big store is never all in memory at once.

        Multicast copies (same msg_id) share one body and headers object, as `copy_for` does.
        """

    def index(self) -> list[IndexRun] | None:
        """Every stored message by its index, a run per group (`store_reads.IndexRun`), if
        this store reads them without the bodies; None if it cannot (then `messages`)."""
        return None

    @abstractmethod
    def message_count(self) -> int:
        """Messages stored (each queue's copy counts)."""

    @abstractmethod
    def load_queues(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(address, queue, settings) of every saved queue, in creation order."""

    @abstractmethod
    def read_ids(self, queue: str, wanted: Sequence[Sequence[int]]) -> list[list[Message]]:
        """Per list of msg ids: those stored messages of `queue`, oldest first (paged
        messages read back as room frees; any thread)."""

    @abstractmethod
    def load_marks(self) -> dict[str, int]:
        """Per forwarding origin, the highest sequence stored here (see `write(marks=...)`)."""

    @abstractmethod
    def load_ids(self) -> list[tuple[str, str, int]]:
        """(address, duplicate id, msg id) of every stored duplicate-detection id, oldest first."""

    @abstractmethod
    def store_id(self) -> int:
        """A random number fixed when the store was created: this store's identity."""

    @abstractmethod
    def max_msg_id(self) -> int:
        """Highest msg_id ever stored (also after its removal), so ids never repeat; 0 if none."""

    @abstractmethod
    def disk_bytes(self) -> int:
        """Bytes the store holds on disk."""

    def snapshot(self) -> tuple[sqlite_file.Pinned, asyncio.Future[None]]:
        """A read snapshot of every write requested before this call (ha: a backup's
        catch-up); only the SQLite format has one."""
        raise StoreError(f"{self.path}: this store format cannot be replicated")

    # ------------------------------------------------------------------ durable writes

    async def write(
        self,
        added: Sequence[Message] = (),
        removed: Sequence[Message] = (),
        updated: Sequence[Message] = (),
        marks: Mapping[str, int] = _NO_MARKS,
        delivered: Sequence[Message] = (),
        ids: Sequence[tuple[str, str, int | None]] = (),
    ) -> None:
        """Store, remove and update (delivery count of) persistent messages, durably.

        `delivered` messages are about to be delivered once more: their count is stored as
        one more than now, so a crash before their ack shows the next delivery as a redelivery.

        Within one call adds apply first, then updates, then removals; calls apply in call
        order. Non-persistent messages are ignored; with nothing persistent this returns at
        once. Resolves after the transaction holding this call is durable.
        `marks` raises forwarding high-water marks (origin -> seq, never lowered) in the same
        transaction as the messages, so a forwarded message and the fact that it arrived are
        durable together or not at all. `ids` keep (address, duplicate id, msg id) or forget
        (msg id None) duplicate-detection ids, in order, in the same transaction too.
        """
        counts = [(m.delivery_count, m.msg_id, m.queue) for m in updated if m.persistent]
        counts += [(m.delivery_count + 1, m.msg_id, m.queue) for m in delivered if m.persistent]
        removals = [(m.msg_id, m.queue) for m in removed if m.persistent]
        record = MessageWrite(stored(added), removals, counts, list(marks.items()), list(ids))
        size = record.size
        if size:
            await self._submit(Request(WRITE, record, size))

    async def save_queue(self, address: str, queue: str, settings: dict) -> None:
        """Create or replace a queue definition (JSON-serialisable settings), durably."""
        await self._submit(_request(QueueSaved(queue, address, dumps(settings))))

    async def delete_queue(self, queue: str) -> None:
        """Remove a queue definition and all of its stored messages, durably."""
        await self._submit(_request(QueueDeleted(queue)))

    @property
    def is_open(self) -> bool:
        """Whether writes are taken: not closed, and the writer thread runs."""
        return not self._closed and self._thread is not None and self._thread.is_alive()

    async def close(self) -> None:
        """Finish queued work, compact, close the files."""
        thread = self._thread
        if self._closed:
            if thread is not None and thread.is_alive():
                await asyncio.to_thread(thread.join)
            return
        self._closed = True
        await self._submit(Request(CLOSE, None, 0), closing=True)
        if thread is not None:
            await asyncio.to_thread(thread.join)

    def give_back_space(self) -> None:
        """Return the store's free room to the OS when the writer is next idle: the disk is
        tight (and the reserve wants its room back)."""
        if self._thread is None or self._closed:
            return
        self._compaction_wanted = True
        self._requests.put(_request(MessageWrite()))  # a write of nothing wakes the writer

    def apply(self, record: StoreWrite) -> asyncio.Future[None]:
        """Apply a write record as another store's tap saw it (ha: the primary's, on the
        backup); enqueued now, in call order, and durable once the future resolves."""
        if not self.is_open:
            raise StoreClosed(f"{self.path}: store is closed")
        return sqlite_file.enqueue(self._requests, _request(record))

    async def _submit(self, request: Request, closing: bool = False) -> None:
        if self._closed and not closing:
            raise StoreClosed(f"{self.path}: store is closed")
        if self._thread is None or not self._thread.is_alive():
            raise StoreError(f"{self.path}: writer thread is not running")
        local = sqlite_file.enqueue(self._requests, request)
        # In the same step as the enqueue, so the backup sees writes in the order we apply them.
        shipped = None if self.tap is None or closing else self.tap(request.payload)
        await local
        if shipped is not None:
            await shipped

    # ------------------------------------------------------------------ writer thread hooks

    @abstractmethod
    def _commit(self, handle: Handle, records: list[StoreWrite]) -> None:
        """Apply records in call order as one durable transaction; on failure leave nothing of
        them behind and raise."""

    @abstractmethod
    def _no_room(self, exc: BaseException) -> bool:
        """The error says there was no room for the write."""

    @abstractmethod
    def _housekeep(self, handle: Handle) -> None:
        """After a batch: compact if it is due (or `_compaction_wanted`)."""

    @abstractmethod
    def _finish(self, handle: Handle) -> BaseException | None:
        """At close, after the last batch: compact, close the files; the error, if any."""

    def _pin(self, handle: Handle, request: Request) -> None:
        sqlite_file.settle([request], [StoreError(f"{self.path}: no snapshots here")])

    # ------------------------------------------------------------------ writer thread

    def _serve(self, handle: Handle) -> None:
        while True:
            batch, closing = sqlite_file.take(self._requests, CLOSE, MAX_BATCH_OPS)
            if batch:
                try:
                    self._process(handle, batch)
                except Exception as exc:  # a bug here must not leave callers waiting forever
                    log.exception("store writer failed", path=str(self.path))
                    sqlite_file.settle(batch, [self._failure(exc) for _ in batch])
            if closing is not None and closing.kind == sqlite_file.SNAPSHOT:
                self._pin(handle, closing)
            elif closing is not None:
                sqlite_file.settle([closing], [self._finish(handle)])
                return
            self._housekeep(handle)

    def _process(self, handle: Handle, batch: list[Request]) -> None:
        errors: list[BaseException | None]
        try:
            self._until_it_fits(handle, batch)
            errors = [None] * len(batch)
        except Exception as exc:
            if len(batch) == 1:
                errors = [self._failure(exc)]
            else:  # isolate the culprit: a disk error fails all, a bad row only its call
                errors = []
                for request in batch:
                    try:
                        self._until_it_fits(handle, [request])
                        errors.append(None)
                    except Exception as exc_one:
                        errors.append(self._failure(exc_one))
        if self._failing and None in errors:
            self._failing = False
            log.info("store writes succeed again", path=str(self.path))
        sqlite_file.settle(batch, errors)

    def _failure(self, exc: Exception) -> StoreError:
        if not self._failing:  # once per run of failures: a full disk fails every write
            self._failing = True
            log.warning("store write failed", path=str(self.path), error=str(exc))
        error = StoreError(f"{self.path}: write failed: {exc}")
        error.__cause__ = exc
        return error

    def _until_it_fits(self, handle: Handle, batch: list[Request]) -> None:
        """`_transaction`, retried while the disk is full (with `on_full`, see the class)."""
        logged = False
        while True:
            try:
                self._transaction(handle, batch)
            except Exception as exc:
                if self._on_full is None or self._closed or not self._no_room(exc):
                    raise
                if self._on_full():
                    log.warning("disk full: released the disk reserve", path=str(self.path))
                    continue
                if not logged:
                    log.error("disk full: store writes wait for space", path=str(self.path))
                    logged = True
                self.waiting_for_space = True
                time.sleep(FULL_RETRY_S)
                continue
            if logged:
                log.warning("disk space back: store writes go on", path=str(self.path))
            self.waiting_for_space = False
            return

    def _transaction(self, handle: Handle, batch: list[Request]) -> None:
        began = time.perf_counter_ns()
        self._commit(handle, [r.payload for r in batch])
        self.commit_ns.observe(time.perf_counter_ns() - began)
        self.batch_ops.observe(sum(r.size for r in batch))
        self.commits += 1


def _request(record: StoreWrite) -> Request:
    """A write record for the writer thread, counted by the operations it holds."""
    return Request(WRITE, record, record.size)
