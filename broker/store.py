"""Durable message storage: one SQLite file in WAL mode, written by one thread with group commit.

Why SQLite in WAL mode
    A broker's disk pattern is "append many small records, delete most of them soon after".
    SQLite gives us crash-safe transactions, checksummed recovery and a format that ops can
    inspect with the `sqlite3` shell, without writing a log format of our own. In WAL mode a
    commit is one sequential append to the `-wal` file plus one fsync; pages are copied back
    into the main file later by checkpoints, off the acknowledgement path, and readers (the
    `load_*` calls, `broker/store_reads.py`) never block the writer.

Why group commit on one writer thread
    The fsync, not the SQL, is the cost of a durable write. Every `write()` queues its
    operations and waits; the writer thread takes everything queued (up to
    `MAX_BATCH_OPS` operations), applies it in call order in ONE transaction and fsyncs once,
    then resolves the waiting futures in call order. While it is fsyncing, new calls pile up
    and form the next batch, so throughput grows with concurrency instead of being one fsync
    per message. The event loop never touches the disk: it only turns each call into a write
    record (`broker/store_writes.py`) and enqueues it. Within a batch, operations on the same
    (queue, msg_id) are folded to their net effect (an add and a remove in the same batch
    become a single delete of nothing), which makes fast produce-consume cycles nearly free.

What is fsynced when
    * `synchronous=FULL`: every transaction's WAL frames are fsynced before COMMIT returns, and
      a `write()` / `save_queue()` / `delete_queue()` resolves only after that. The broker acks
      a send only after `write()` resolves, so neither a kill -9 nor a power cut loses an
      acknowledged message (SQLite also fsyncs the directory when it creates the WAL file; we
      fsync the directory once after creating the database file).
    * Checkpoints (automatic every ~1000 WAL pages, and TRUNCATE ones during compaction and at
      close) fsync the WAL and then the database file before the WAL is reused.
    * A failed transaction (disk full, I/O error) is rolled back and the futures of that batch
      are rejected with `StoreError`; the thread carries on with later batches. When a batch
      of several calls fails, each call is retried alone so one bad call cannot fail others.

Bounded disk
    `auto_vacuum=INCREMENTAL` (set before the first table exists) keeps a free-page list that
    new inserts reuse, so steady churn does not grow the file. After `COMPACT_AFTER_DELETES`
    deleted rows, whenever the request queue is idle, the writer returns free pages to the
    OS in steps of `VACUUM_STEP_PAGES` (yielding to new writes between steps) and then runs
    `wal_checkpoint(TRUNCATE)`. `journal_size_limit` caps what an idle WAL keeps on disk.

Refusing bad files
    `open()` never starts empty over something it cannot read: a file that is not SQLite, a
    truncated or corrupt database (`PRAGMA quick_check`), or a SQLite file that is not a pinmq
    store raises `StoreError` naming the path. All of these checks run on a read-only
    connection, so a rejected file is left byte-for-byte unchanged.

Replicated writes (ha)
    The primary's replication sees every write record in call order through `tap`, and a
    backup's store applies them with `apply`: the records, not the writer's batches, are what
    replication carries (`cluster/replication_wire.py`).

Not handled here: two processes opening the same file (guard the data directory instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

import structlog

from broker import sqlite_file, store_sql
from broker.histogram import Histogram
from broker.message import Message
from broker.sqlite_file import Request, Requests
from broker.store_reads import StoreClosed, StoreError, StoreReads
from broker.store_sql import APPLICATION_ID, SCHEMA, SCHEMA_VERSION
from broker.store_writes import (
    MessageWrite,
    QueueDeleted,
    QueueSaved,
    StoreWrite,
    dumps,
    stored,
)

log = structlog.get_logger(__name__)
_NO_MARKS: Mapping[str, int] = MappingProxyType({})

MAX_BATCH_OPS = 5000
COMPACT_AFTER_DELETES = 10_000
VACUUM_STEP_PAGES = 1024  # ~10-20 ms of work: the most a new write waits behind compaction
JOURNAL_SIZE_LIMIT = 16 * 1024 * 1024
CACHE_KIB = 16 * 1024
BUSY_TIMEOUT_MS = 5000
FULL_RETRY_S = 0.2  # how often a write that found the disk full tries again
# /metrics' buckets: a commit's time in ns (an fsync takes from 0.1 ms to tens of ms), and the
# operations of a batch (one to MAX_BATCH_OPS).
COMMIT_BOUNDS_NS = tuple(int(ms * 1_000_000) for ms in (0.25, 0.5, 1, 2.5, 5, 10, 25, 100, 1000))
BATCH_BOUNDS = (1, 4, 16, 64, 256, 1024, MAX_BATCH_OPS)

# Request kinds handled by the writer thread: a `StoreWrite` record, or the close.
_WRITE, _CLOSE = range(2)


class Store(StoreReads):
    """Persistent messages, queue definitions and duplicate ids of one node, in one SQLite file.

    Build with `Store.open(path)`. The sync `load_*` / `max_msg_id` calls are for start-up;
    the async calls are durable when they resolve. Cancelling a waiting `write()` does not
    cancel the write. `commits` and `compactions` count transactions and compaction runs.
    """

    TABLES = ("meta", "queues", "messages", "marks", "duplicate_ids")  # what a backup copies

    def __init__(
        self, path: Path, max_bytes: int | None = None, on_full: Callable[[], bool] | None = None
    ) -> None:
        self.path = path
        self.commits = 0
        # For /metrics, kept by the writer thread: each transaction's time (BEGIN to COMMIT,
        # the fsync included) and the operations it carried.
        self.commit_ns = Histogram(COMMIT_BOUNDS_NS)
        self.batch_ops = Histogram(BATCH_BOUNDS)
        self.compactions = 0
        self.waiting_for_space = False  # a write found the disk full and waits to retry
        self.free_bytes = 0  # free pages inside the file: room for messages, not yet the OS's
        self._page_size = 4096
        self._max_bytes = max_bytes
        self._on_full = on_full
        self._requests: Requests = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._max_id = 0
        self._deleted_since_compaction = 0
        self._compaction_wanted = False
        # ha: the primary's replication sees every write record here, in call order
        self.tap: sqlite_file.Tap[StoreWrite] | None = None

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        max_bytes: int | None = None,
        on_full: Callable[[], bool] | None = None,
    ) -> Store:
        """Open or create the store at `path` and start its writer thread.

        Raises `StoreError` (naming the path) if the file is not a readable, intact pinmq
        store; the file is then left untouched. `max_bytes` optionally caps the database
        size, beyond which writes fail with `StoreError` instead of filling the disk.

        With `on_full` (called on the writer thread; it frees space and says whether it
        did), a write that finds the disk full is retried instead of failing: at once if
        `on_full` freed something, else every `FULL_RETRY_S` until it fits or the store
        closes. Nothing acknowledged is ever dropped for want of space, and acks wait rather
        than fail.
        """
        path = Path(path)
        fresh = sqlite_file.prepare(
            path,
            what="pinmq store",
            application_id=APPLICATION_ID,
            schema_version=SCHEMA_VERSION,
            error=StoreError,
        )
        store = cls(path, max_bytes, on_full)
        store._start(fresh)
        return store

    def _start(self, fresh: bool) -> None:
        self._thread = sqlite_file.start_writer(
            f"store-writer:{self.path.name}", lambda: self._connect(fresh), self._serve
        )

    def _connect(self, fresh: bool) -> sqlite3.Connection:
        """The writer connection, configured and with the schema in place (writer thread)."""
        pragmas = [
            f"busy_timeout = {BUSY_TIMEOUT_MS}",
            f"journal_size_limit = {JOURNAL_SIZE_LIMIT}",
            f"cache_size = -{CACHE_KIB}",
        ]
        if self._max_bytes is not None:
            # SQLite's default page size (4 KiB) is used: set before the first table exists
            pragmas.append(f"max_page_count = {max(1, self._max_bytes // 4096)}")
        conn = sqlite_file.open_writer(
            self.path,
            fresh=fresh,
            schema=SCHEMA,
            application_id=APPLICATION_ID,
            schema_version=SCHEMA_VERSION,
            pragmas=pragmas,
            error=StoreError,
        )
        row = conn.execute("SELECT value FROM meta WHERE key = 'max_msg_id'").fetchone()
        self._max_id = int(row[0])
        self._page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        self._count_free(conn)
        return conn

    def _count_free(self, conn: sqlite3.Connection) -> None:
        self.free_bytes = conn.execute("PRAGMA freelist_count").fetchone()[0] * self._page_size

    def max_msg_id(self) -> int:
        """Highest msg_id ever stored (also after its removal), so ids never repeat; 0 if none."""
        return self._max_id

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
        once. Resolves after the transaction holding this call is committed and fsynced.
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
            await self._submit(Request(_WRITE, record, size))

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
        """Finish queued work, compact, checkpoint the WAL away, close the file."""
        thread = self._thread
        if self._closed:
            if thread is not None and thread.is_alive():
                await asyncio.to_thread(thread.join)
            return
        self._closed = True
        await self._submit(Request(_CLOSE, None, 0), closing=True)
        if thread is not None:
            await asyncio.to_thread(thread.join)

    def give_back_space(self) -> None:
        """Return the file's free pages to the OS when the writer is next idle, whatever the
        count of deletes: the disk is tight (and the reserve wants its room back)."""
        if self._thread is None or self._closed:
            return
        self._compaction_wanted = True
        self._requests.put(_request(MessageWrite()))  # a write of nothing wakes the writer

    def disk_bytes(self) -> int:
        """Bytes on disk: database file plus WAL file."""
        return sqlite_file.disk_bytes(self.path)

    def snapshot(self) -> tuple[sqlite_file.Pinned, asyncio.Future[None]]:
        """A read snapshot of every write requested before this call, pinned once the future
        resolves (ha: a backup's catch-up); enqueued now, so it falls between two writes."""
        if not self.is_open:
            raise StoreClosed(f"{self.path}: store is closed")
        return sqlite_file.snapshot(self._requests)

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

    # ------------------------------------------------------------------ writer thread

    def _serve(self, conn: sqlite3.Connection) -> None:
        while True:
            batch, closing = sqlite_file.take(self._requests, _CLOSE, MAX_BATCH_OPS)
            if batch:
                try:
                    self._process(conn, batch)
                except Exception as exc:  # a bug here must not leave callers waiting forever
                    log.exception("store writer failed", path=str(self.path))
                    sqlite_file.settle(batch, [self._failure(exc) for _ in batch])
            if closing is not None and closing.kind == sqlite_file.SNAPSHOT:
                self._pin(closing)
            elif closing is not None:
                self._finish(conn, closing)
                return
            if self._deleted_since_compaction >= COMPACT_AFTER_DELETES or (
                self._compaction_wanted and self.free_bytes
            ):
                self._compact(conn, step=VACUUM_STEP_PAGES)

    def _process(self, conn: sqlite3.Connection, batch: list[Request]) -> None:
        errors: list[BaseException | None]
        try:
            self._until_it_fits(conn, batch)
            errors = [None] * len(batch)
        except Exception as exc:
            if len(batch) == 1:
                errors = [self._failure(exc)]
            else:  # isolate the culprit: a disk error fails all, a bad row only its call
                errors = []
                for request in batch:
                    try:
                        self._until_it_fits(conn, [request])
                        errors.append(None)
                    except Exception as exc_one:
                        errors.append(self._failure(exc_one))
        sqlite_file.settle(batch, errors)

    def _failure(self, exc: Exception) -> StoreError:
        log.warning("store write failed", path=str(self.path), error=str(exc))
        error = StoreError(f"{self.path}: write failed: {exc}")
        error.__cause__ = exc
        return error

    def _until_it_fits(self, conn: sqlite3.Connection, batch: list[Request]) -> None:
        """`_transaction`, retried while the disk is full (with `on_full`, see `open`)."""
        logged = False
        while True:
            try:
                self._transaction(conn, batch)
            except sqlite3.Error as exc:
                if self._on_full is None or self._closed or not sqlite_file.disk_full(exc):
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

    def _transaction(self, conn: sqlite3.Connection, batch: list[Request]) -> None:
        """Apply a batch in call order as one transaction; raises after rolling back."""
        began = time.perf_counter_ns()
        conn.execute("BEGIN IMMEDIATE")
        try:
            max_id, deleted = store_sql.apply(conn, [r.payload for r in batch], self._max_id)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
        self.commit_ns.observe(time.perf_counter_ns() - began)
        self.batch_ops.observe(sum(r.size for r in batch))
        self._max_id = max_id
        self._deleted_since_compaction += deleted
        self.commits += 1
        self._count_free(conn)

    def _pin(self, request: Request) -> None:
        error: StoreError | None = None
        try:
            request.payload.pin(self.path)
        except sqlite3.Error as exc:
            error = StoreError(f"{self.path}: cannot pin a snapshot: {exc}")
        sqlite_file.settle([request], [error])

    def _compact(self, conn: sqlite3.Connection, step: int | None) -> None:
        """Give free pages back to the OS while idle, then truncate the WAL.

        With `step`, vacuum that many pages per transaction and stop as soon as a request
        is waiting (the counter stays high, so the next idle moment resumes).
        """
        pragma = "PRAGMA incremental_vacuum" + (f"({step})" if step else "")
        free_before = -1
        try:
            while self._requests.empty() or step is None:
                free = conn.execute("PRAGMA freelist_count").fetchone()[0]
                if free == 0 or free == free_before:  # done, or no auto_vacuum in this file
                    break
                free_before = free
                # executescript steps the pragma to completion; execute() frees one page.
                conn.executescript(f"BEGIN IMMEDIATE; {pragma}; COMMIT;")
                if step is None:
                    break
            else:
                return
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            log.warning("store compaction failed", path=str(self.path), error=str(exc))
            return
        self._deleted_since_compaction = 0
        self._compaction_wanted = False
        self.compactions += 1
        self._count_free(conn)

    def _finish(self, conn: sqlite3.Connection, request: Request) -> None:
        error: BaseException | None = None
        try:
            if self._deleted_since_compaction:
                self._compact(conn, step=None)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as exc:
            # Everything is committed in the WAL, which the next open replays: not a failure.
            log.warning("checkpoint at close failed", path=str(self.path), error=str(exc))
        finally:
            try:
                conn.close()
            except sqlite3.Error as exc:
                error = StoreError(f"{self.path}: close failed: {exc}")
        sqlite_file.settle([request], [error])


def _request(record: StoreWrite) -> Request:
    """A write record for the writer thread, counted by the operations it holds."""
    return Request(_WRITE, record, record.size)
