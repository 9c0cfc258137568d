"""Durable group bindings of the LOCAL grouping handler: `<data-dir>/bindings.db`.

The same recipe as the message store (`broker/store.py`), with the writer thread both take
from `broker/sqlite_file.py`, in a file of its own so bindings can be inspected, copied to a
backup or wiped without touching messages: SQLite in WAL mode with `synchronous=FULL`, one
writer thread, group commit. `put` and `delete` enqueue their rows at
call time and return a future that resolves once the transaction holding them is committed and
fsynced; so the order of calls is the order of commits, even for a delete that nobody awaits
followed by a put of the same key. Within a batch operations on one key fold to the last one.
Each call is one write record (`BindingsPut`, `BindingsDeleted`): what the primary's ha
replication sees through `tap` and a backup's file applies with `apply`.

A file that is not an intact bindings database is refused (`BindingStoreError` naming the
path) and left untouched: starting empty over lost bindings could pin a group twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

from broker import sqlite_file
from broker.futures import taken
from broker.sqlite_file import Request, Requests
from handler.records import Binding, Key

log = structlog.get_logger(__name__)

FILE_NAME = "bindings.db"
APPLICATION_ID = 0x706D7162  # "pmqb": marks the file as pinmq bindings
SCHEMA_VERSION = 1
MAX_BATCH_OPS = 5000
JOURNAL_SIZE_LIMIT = 4 * 1024 * 1024
BUSY_TIMEOUT_MS = 5000
_SCHEMA = """CREATE TABLE IF NOT EXISTS bindings (
    grp TEXT NOT NULL,
    queue TEXT NOT NULL,
    node TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    PRIMARY KEY (grp, queue)) WITHOUT ROWID"""
_PUT = "INSERT OR REPLACE INTO bindings (grp, queue, node, epoch) VALUES (?, ?, ?, ?)"
_DELETE = "DELETE FROM bindings WHERE grp = ? AND queue = ?"
_WRITE_OP, _CLOSE_OP = range(2)


@dataclass(frozen=True, slots=True)
class BindingsPut:
    """Bindings stored, each replacing any of its (group, queue)."""

    bindings: tuple[Binding, ...]


@dataclass(frozen=True, slots=True)
class BindingsDeleted:
    """Bindings removed by (group, queue)."""

    keys: tuple[Key, ...]


BindingsWrite = BindingsPut | BindingsDeleted


class BindingStoreError(Exception):
    """The bindings file cannot be used or written; the message names the path and why."""


KIND = sqlite_file.FileKind(
    "pinmq bindings file", APPLICATION_ID, SCHEMA_VERSION, BindingStoreError
)


class BindingStore:
    """Bindings in one SQLite file; build with `BindingStore.open(path)`."""

    TABLES = ("bindings",)  # what a backup copies to catch up

    def __init__(self, path: Path) -> None:
        self.path = path
        self.commits = 0
        self._requests: Requests = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        # ha: the primary's replication sees every write record here, in call order
        self.tap: sqlite_file.Tap[BindingsWrite] | None = None

    @classmethod
    def open(cls, path: Path) -> BindingStore:
        """Open or create the file and start the writer; raises `BindingStoreError` if bad."""
        path = Path(path)
        fresh = sqlite_file.prepare(path, KIND)
        store = cls(path)
        store._thread = sqlite_file.start_writer(
            f"bindings-writer:{path}", lambda: store._connect(fresh), store._serve
        )
        return store

    def load(self) -> list[Binding]:
        """Every stored binding (committed ones, read through a read-only connection)."""
        try:
            conn = sqlite_file.read_only(self.path)
        except sqlite3.Error as exc:
            raise BindingStoreError(f"{self.path}: cannot open for reading: {exc}") from exc
        try:
            rows = conn.execute("SELECT grp, queue, node, epoch FROM bindings").fetchall()
        except sqlite3.Error as exc:
            raise BindingStoreError(f"{self.path}: read failed: {exc}") from exc
        finally:
            conn.close()
        return [Binding(g, q, n, e) for g, q, n, e in rows]

    def put(self, bindings: Iterable[Binding]) -> asyncio.Future[None]:
        """Store (or replace) bindings; enqueued now, the future resolves once durable."""
        return self.apply(BindingsPut(tuple(bindings)))

    def delete(self, keys: Iterable[Key]) -> asyncio.Future[None]:
        """Remove bindings by (group, queue); enqueued now, the future resolves once durable."""
        return self.apply(BindingsDeleted(tuple(keys)))

    async def close(self) -> None:
        """Finish queued writes, checkpoint the WAL into the file, close it."""
        if self._closed:
            return
        self._closed = True
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        with contextlib.suppress(BindingStoreError):
            await self._submit(Request(_CLOSE_OP, None, 0), closing=True)
        await asyncio.to_thread(thread.join)

    def snapshot(self) -> tuple[sqlite_file.Pinned, asyncio.Future[None]]:
        """A read snapshot of every write requested before this call, pinned once the future
        resolves (ha: a backup's catch-up); enqueued now, so it falls between two writes."""
        if self._closed or self._thread is None or not self._thread.is_alive():
            raise BindingStoreError(f"{self.path}: bindings store is closed")
        return sqlite_file.snapshot(self._requests)

    def apply(self, record: BindingsWrite) -> asyncio.Future[None]:
        """Apply a write record (`put` and `delete` make theirs; ha: the backup applies the
        primary's, as its tap saw them); enqueued now, the future resolves once durable."""
        size = len(record.bindings) if type(record) is BindingsPut else len(record.keys)
        return self._submit(Request(_WRITE_OP, record, size))

    def _submit(self, request: Request, closing: bool = False) -> asyncio.Future[None]:
        if self._closed and not closing:
            future = _failed(BindingStoreError(f"{self.path}: bindings store is closed"))
        elif self._thread is None or not self._thread.is_alive():
            future = _failed(BindingStoreError(f"{self.path}: writer is not running"))
        else:
            future = sqlite_file.enqueue(self._requests, request)
            if self.tap is not None and not closing:
                shipped = self.tap(request.payload)
                if shipped is not None:  # durable once on the backup too
                    future = _both(future, shipped)
        future.add_done_callback(taken)
        return future

    # ---- writer thread ------------------------------------------------------------------

    def _serve(self, conn: sqlite3.Connection) -> None:
        while True:
            batch, closing = sqlite_file.take(self._requests, _CLOSE_OP, MAX_BATCH_OPS)
            if batch:
                error: BaseException | None = None
                try:
                    self._transaction(conn, batch)
                except Exception as exc:
                    log.warning("bindings write failed", path=str(self.path), error=str(exc))
                    error = BindingStoreError(f"{self.path}: write failed: {exc}")
                    error.__cause__ = exc
                sqlite_file.settle(batch, [error] * len(batch))
            if closing is not None and closing.kind == sqlite_file.SNAPSHOT:
                error = None
                try:
                    closing.payload.pin(self.path)
                except sqlite3.Error as exc:
                    error = BindingStoreError(f"{self.path}: cannot pin a snapshot: {exc}")
                sqlite_file.settle([closing], [error])
            elif closing is not None:
                error = None
                try:
                    conn.executescript("PRAGMA incremental_vacuum;")  # to completion
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                    conn.close()
                except sqlite3.Error as exc:
                    error = BindingStoreError(f"{self.path}: close failed: {exc}")
                sqlite_file.settle([closing], [error])
                return

    def _transaction(self, conn: sqlite3.Connection, batch: list[Request]) -> None:
        net: dict[Key, tuple[str, str, str, int] | None] = {}  # row: put, None: delete
        for request in batch:
            record = request.payload
            if type(record) is BindingsPut:
                for b in record.bindings:
                    net[(b.group, b.queue)] = (b.group, b.queue, b.node, b.epoch)
            else:
                for key in record.keys:
                    net[key] = None
        puts = [row for row in net.values() if row is not None]
        dels = [key for key, row in net.items() if row is None]
        conn.execute("BEGIN IMMEDIATE")
        try:
            if dels:
                conn.executemany(_DELETE, dels)
            if puts:
                conn.executemany(_PUT, puts)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
        self.commits += 1

    def _connect(self, fresh: bool) -> sqlite3.Connection:
        return sqlite_file.open_writer(
            self.path,
            KIND,
            fresh=fresh,
            schema=[_SCHEMA],
            pragmas=[
                f"busy_timeout = {BUSY_TIMEOUT_MS}",
                f"journal_size_limit = {JOURNAL_SIZE_LIMIT}",
            ],
        )


def _both(local: asyncio.Future[None], shipped: asyncio.Future[None]) -> asyncio.Future[None]:
    """Resolves once both have; fails with the first failure."""

    async def wait() -> None:
        await local
        await shipped

    return asyncio.ensure_future(wait())


def _failed(error: BaseException) -> asyncio.Future[None]:
    future = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return future
