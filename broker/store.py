"""Durable message storage in one SQLite file in WAL mode, written by one thread with group
commit (`broker/store_base.py`): `store.format: sqlite`, and what an ha pair replicates.

Why SQLite in WAL mode
    SQLite gives us crash-safe transactions, checksummed recovery, a format that ops can
    inspect with the `sqlite3` shell, and read snapshots that a backup's catch-up streams
    while writes go on (the journal, `broker/journal.py`, costs less CPU). In WAL mode a
    commit is one sequential append to the `-wal` file plus one fsync; pages are copied back
    into the main file later by checkpoints, off the acknowledgement path, and readers (the
    `load_*` calls, `broker/store_reads.py`) never block the writer.

Net effects
    Within a batch, operations on the same (queue, msg_id) are folded to their net effect (an
    add and a remove in the same batch become a single delete of nothing), which makes fast
    produce-consume cycles nearly free.

What is fsynced when
    * `synchronous=FULL`: every transaction's WAL frames are fsynced before COMMIT returns, and
      a `write()` / `save_queue()` / `delete_queue()` resolves only after that. The broker acks
      a send only after `write()` resolves, so neither a kill -9 nor a power cut loses an
      acknowledged message (SQLite also fsyncs the directory when it creates the WAL file; we
      fsync the directory once after creating the database file).
    * Checkpoints (automatic every ~1000 WAL pages, and TRUNCATE ones during compaction and at
      close) fsync the WAL and then the database file before the WAL is reused.
    * A failed transaction (disk full, I/O error) is rolled back and the futures of that batch
      are rejected with `StoreError`; the thread carries on with later batches.

Bounded disk
    `auto_vacuum=INCREMENTAL` (set before the first table exists) keeps a free-page list that
    new inserts reuse, so steady churn does not grow the file. After `COMPACT_AFTER_DELETES`
    deleted rows, whenever the request queue is idle, the writer returns free pages to the
    OS in steps of `VACUUM_STEP_PAGES` (yielding to new writes between steps) and then runs
    `wal_checkpoint(TRUNCATE)`, without waiting for readers (a snapshot's read is long).
    `journal_size_limit` caps what an idle WAL keeps on disk.

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
import sqlite3
from collections.abc import Callable
from pathlib import Path

import structlog

from broker import sqlite_file, store_sql
from broker.sqlite_file import Request
from broker.store_base import StoreBase
from broker.store_reads import StoreClosed, StoreError, StoreReads
from broker.store_sql import APPLICATION_ID, SCHEMA, SCHEMA_VERSION
from broker.store_writes import StoreWrite

__all__ = ["Store", "StoreClosed", "StoreError"]

log = structlog.get_logger(__name__)

COMPACT_AFTER_DELETES = 10_000
VACUUM_STEP_PAGES = 1024  # ~10-20 ms of work: the most a new write waits behind compaction
JOURNAL_SIZE_LIMIT = 16 * 1024 * 1024
CACHE_KIB = 16 * 1024
BUSY_TIMEOUT_MS = 5000
KIND = sqlite_file.FileKind("pinmq store", APPLICATION_ID, SCHEMA_VERSION, StoreError)


class Store(StoreReads, StoreBase[sqlite3.Connection]):
    """The store in one SQLite file; build with `Store.open(path)`."""

    TABLES = ("meta", "queues", "messages", "marks", "duplicate_ids")  # what a backup copies

    def __init__(
        self, path: Path, max_bytes: int | None = None, on_full: Callable[[], bool] | None = None
    ) -> None:
        super().__init__(path, on_full)
        self._page_size = 4096
        self._max_bytes = max_bytes
        self._max_id = 0
        self._deleted_since_compaction = 0

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        max_bytes: int | None = None,
        on_full: Callable[[], bool] | None = None,
        walk_pages: bool = True,
    ) -> Store:
        """Open or create the store at `path` and start its writer thread.

        Raises `StoreError` (naming the path) if the file is not a readable, intact pinmq
        store; the file is then left untouched. `max_bytes` optionally caps the database
        size, beyond which writes fail with `StoreError` instead of filling the disk (or wait,
        with `on_full`: see `StoreBase`). `walk_pages`: see `sqlite_file.prepare`.
        """
        path = Path(path)
        fresh = sqlite_file.prepare(path, KIND, walk_pages)
        store = cls(path, max_bytes, on_full)
        store._start(lambda: store._connect(fresh))
        return store

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
        conn = sqlite_file.open_writer(self.path, KIND, fresh=fresh, schema=SCHEMA, pragmas=pragmas)
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

    def disk_bytes(self) -> int:
        """Bytes on disk: database file plus WAL file."""
        return sqlite_file.disk_bytes(self.path)

    def snapshot(self) -> tuple[sqlite_file.Pinned, asyncio.Future[None]]:
        """A read snapshot of every write requested before this call, pinned once the future
        resolves (ha: a backup's catch-up); enqueued now, so it falls between two writes."""
        if not self.is_open:
            raise StoreClosed(f"{self.path}: store is closed")
        return sqlite_file.snapshot(self._requests)

    # ------------------------------------------------------------------ writer thread

    def _no_room(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.Error) and sqlite_file.disk_full(exc)

    def _housekeep(self, conn: sqlite3.Connection) -> None:
        if self._deleted_since_compaction >= COMPACT_AFTER_DELETES or (
            self._compaction_wanted and self.free_bytes
        ):
            self._compact(conn, step=VACUUM_STEP_PAGES)

    def _commit(self, conn: sqlite3.Connection, records: list[StoreWrite]) -> None:
        """Apply records in call order as one transaction; raises after rolling back."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            max_id, deleted = store_sql.apply(conn, records, self._max_id)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
        self._max_id = max_id
        self._deleted_since_compaction += deleted
        self._count_free(conn)

    def _pin(self, conn: sqlite3.Connection, request: Request) -> None:
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
            _truncate_wal_without_waiting(conn)
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

    def _finish(self, conn: sqlite3.Connection) -> BaseException | None:
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
        return error


def _truncate_wal_without_waiting(conn: sqlite3.Connection) -> None:
    """Checkpoint the WAL and truncate it, as far as readers allow now: a TRUNCATE checkpoint
    waits up to the busy timeout for every reader to finish, and a backup's snapshot holds a
    read as long as it streams (a minute at a million messages), so every commit would wait
    behind it. Without the wait it checkpoints what it can, and the next compaction goes on."""
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
