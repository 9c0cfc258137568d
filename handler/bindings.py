"""Durable group bindings of the LOCAL grouping handler: `<data-dir>/bindings.db`.

The same recipe as the message store (`broker/store.py`), in a file of its own so bindings can
be inspected, copied to a backup or wiped without touching messages: SQLite in WAL mode with
`synchronous=FULL`, one writer thread, group commit. `put` and `delete` enqueue their rows at
call time and return a future that resolves once the transaction holding them is committed and
fsynced; so the order of calls is the order of commits, even for a delete that nobody awaits
followed by a put of the same key. Within a batch operations on one key fold to the last one.

A file that is not an intact bindings database is refused (`BindingStoreError` naming the
path) and left untouched: starting empty over lost bindings could pin a group twice.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import structlog

from broker import sqlite_file
from handler.arbiter import Binding, Key

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
_PUT_OP, _DELETE_OP, _CLOSE_OP = range(3)


class BindingStoreError(Exception):
    """The bindings file cannot be used or written; the message names the path and why."""


class _Request:
    __slots__ = ("future", "kind", "loop", "rows")

    def __init__(self, kind: int, rows: list[Any]) -> None:
        self.kind = kind
        self.rows = rows
        self.loop: asyncio.AbstractEventLoop | None = None
        self.future: asyncio.Future[None] | None = None


class BindingStore:
    """Bindings in one SQLite file; build with `BindingStore.open(path)`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.commits = 0
        self._requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    @classmethod
    def open(cls, path: Path) -> BindingStore:
        """Open or create the file and start the writer; raises `BindingStoreError` if bad."""
        path = Path(path)
        fresh = sqlite_file.prepare(
            path,
            what="pinmq bindings file",
            application_id=APPLICATION_ID,
            schema_version=SCHEMA_VERSION,
            error=BindingStoreError,
        )
        store = cls(path)
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        store._thread = threading.Thread(
            target=store._run, args=(ready, fresh), name=f"bindings-writer:{path}", daemon=True
        )
        store._thread.start()
        ready.result()
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
        rows = [(b.group, b.queue, b.node, b.epoch) for b in bindings]
        return self._submit(_Request(_PUT_OP, rows))

    def delete(self, keys: Iterable[Key]) -> asyncio.Future[None]:
        """Remove bindings by (group, queue); enqueued now, the future resolves once durable."""
        return self._submit(_Request(_DELETE_OP, list(keys)))

    async def close(self) -> None:
        """Finish queued writes, checkpoint the WAL into the file, close it."""
        if self._closed:
            return
        self._closed = True
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        with contextlib.suppress(BindingStoreError):
            await self._submit(_Request(_CLOSE_OP, []), closing=True)
        await asyncio.to_thread(thread.join)

    def _submit(self, request: _Request, closing: bool = False) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        future.add_done_callback(_retrieve)
        if self._closed and not closing:
            future.set_exception(BindingStoreError(f"{self.path}: bindings store is closed"))
        elif self._thread is None or not self._thread.is_alive():
            future.set_exception(BindingStoreError(f"{self.path}: writer is not running"))
        else:
            request.loop = loop
            request.future = future
            self._requests.put(request)
        return future

    # ---- writer thread ------------------------------------------------------------------

    def _run(self, ready: concurrent.futures.Future[None], fresh: bool) -> None:
        try:
            conn = self._connect(fresh)
        except BaseException as exc:
            ready.set_exception(exc)
            return
        ready.set_result(None)
        while True:
            batch, closing = self._take()
            if batch:
                error: BaseException | None = None
                try:
                    self._transaction(conn, batch)
                except Exception as exc:
                    log.warning("bindings write failed", path=str(self.path), error=str(exc))
                    error = BindingStoreError(f"{self.path}: write failed: {exc}")
                    error.__cause__ = exc
                _resolve(batch, error)
            if closing is not None:
                error = None
                try:
                    conn.executescript("PRAGMA incremental_vacuum;")  # to completion
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                    conn.close()
                except sqlite3.Error as exc:
                    error = BindingStoreError(f"{self.path}: close failed: {exc}")
                _resolve([closing], error)
                return

    def _take(self) -> tuple[list[_Request], _Request | None]:
        """Block for one request, then take whatever else is queued, up to the bound."""
        request = self._requests.get()
        batch: list[_Request] = []
        size = 0
        while True:
            if request.kind == _CLOSE_OP:
                return batch, request
            batch.append(request)
            size += len(request.rows)
            if size >= MAX_BATCH_OPS:
                return batch, None
            try:
                request = self._requests.get_nowait()
            except queue.Empty:
                return batch, None

    def _transaction(self, conn: sqlite3.Connection, batch: list[_Request]) -> None:
        net: dict[Key, tuple[str, str, str, int] | None] = {}  # row: put, None: delete
        for request in batch:
            if request.kind == _PUT_OP:
                for row in request.rows:
                    net[(row[0], row[1])] = row
            else:
                for key in request.rows:
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
            fresh=fresh,
            schema=[_SCHEMA],
            application_id=APPLICATION_ID,
            schema_version=SCHEMA_VERSION,
            pragmas=[
                f"busy_timeout = {BUSY_TIMEOUT_MS}",
                f"journal_size_limit = {JOURNAL_SIZE_LIMIT}",
            ],
            error=BindingStoreError,
        )


def _retrieve(future: asyncio.Future[None]) -> None:
    """Mark a failure as seen: deletes are fire-and-forget and their errors are logged."""
    if not future.cancelled():
        future.exception()


def _resolve(batch: list[_Request], error: BaseException | None) -> None:
    sqlite_file.hand_back((r.loop, r.future, error) for r in batch)
