"""Checks and helpers shared by pinmq's SQLite files (the message store, the bindings).

A file is verified read-only before anything may write to it, so a corrupt, truncated or
foreign file is refused with a message naming it and is left exactly as it was. Each file
has one writer thread owning its writing connection: callers enqueue requests, the thread
takes them in batches (one transaction, one fsync each) and resolves their futures.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

_SQLITE_MAGIC = b"SQLite format 3\x00"

# What a writer thread hands back for one request: the waiter's loop and future, and its error.
Outcome = tuple[asyncio.AbstractEventLoop | None, asyncio.Future[None] | None, BaseException | None]
Settled = list[tuple[asyncio.Future[None], BaseException | None]]


def wal_path(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def disk_bytes(path: Path) -> int:
    """Database file plus WAL file."""
    return file_size(path) + file_size(wal_path(path))


def disk_full(exc: sqlite3.Error) -> bool:
    """The error says there was no room for a write.

    SQLITE_FULL (a full disk, or the file at its `max_page_count`), or an I/O error on write
    or fsync (how ENOSPC can surface while the WAL grows).
    """
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return "disk is full" in str(exc)
    return code & 0xFF == sqlite3.SQLITE_FULL or code in _WRITE_IO_ERRORS


_WRITE_IO_ERRORS = frozenset(
    getattr(sqlite3, name)
    for name in ("SQLITE_IOERR_WRITE", "SQLITE_IOERR_FSYNC", "SQLITE_IOERR_TRUNCATE")
    if hasattr(sqlite3, name)
)


def is_fresh(path: Path) -> bool:
    """No database and no WAL yet: the file may be created."""
    return disk_bytes(path) == 0


def read_only(path: Path) -> sqlite3.Connection:
    """A connection that cannot modify the database file (it is opened O_RDONLY)."""
    return sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)


@dataclass(frozen=True)
class FileKind:
    """What a SQLite file of ours must be, and the error that refuses one that is not."""

    what: str  # named in errors: "pinmq store"
    application_id: int
    schema_version: int
    error: type[Exception]


def prepare(path: Path, kind: FileKind, walk_pages: bool = True) -> bool:
    """Make the directory, then check the file before anyone writes to it; True if it is new.

    Raises `kind.error` (naming the path) if the file is not a readable, intact SQLite file of
    this kind; it is then left untouched. Without `walk_pages`, for a file this process wrote
    and closed a moment ago, the check skips `quick_check`, which reads every page (a quarter
    of a second at a million messages).
    """
    error = kind.error
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise error(f"{path}: cannot create the directory: {exc}") from exc
    if path.exists() and not path.is_file():
        raise error(f"{path}: exists but is not a regular file")
    fresh = is_fresh(path)
    if not fresh:
        verify(path, kind, walk_pages)
    return fresh


def verify(path: Path, kind: FileKind, walk_pages: bool = True) -> None:
    """Raise `kind.error` unless `path` is an intact (or empty) SQLite file of this kind;
    `walk_pages`: with SQLite's `quick_check` of every page."""
    error = kind.error
    try:
        with path.open("rb") as f:
            header = f.read(100)
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc}") from exc
    if header and (len(header) < 100 or not header.startswith(_SQLITE_MAGIC)):
        raise error(f"{path}: not a SQLite database (bad file header); refusing to use it")
    if header and file_size(wal_path(path)) == 0:
        # Without a WAL to replay, the file must hold every page its header counts (the count
        # is trusted only when the change counter matches its version-valid-for number).
        page_size = int.from_bytes(header[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        pages = int.from_bytes(header[28:32], "big")
        if header[24:28] == header[92:96] and file_size(path) < pages * page_size:
            raise error(
                f"{path}: database is truncated: the header counts {pages} pages of "
                f"{page_size} bytes but the file has {file_size(path)} bytes"
            )
    try:
        conn = read_only(path)
    except sqlite3.Error as exc:
        raise error(f"{path}: cannot open: {exc}") from exc
    try:
        problems = [row[0] for row in conn.execute("PRAGMA quick_check(5)")] if walk_pages else []
        if problems not in ([], ["ok"]):
            detail = "; ".join(" ".join(p.split()) for p in problems)[:500]
            raise error(f"{path}: database is corrupt or truncated: {detail}")
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    except sqlite3.DatabaseError as exc:
        raise error(f"{path}: database is corrupt or unreadable: {exc}") from exc
    finally:
        conn.close()
    if tables and app_id != kind.application_id:
        raise error(
            f"{path}: a SQLite database but not a {kind.what} (application_id {app_id}, "
            f"tables {', '.join(sorted(tables))})"
        )
    if version > kind.schema_version:
        raise error(
            f"{path}: {kind.what} schema version {version} is newer than supported "
            f"{kind.schema_version}"
        )


def fsync_dir(directory: Path) -> None:
    """Make a newly created file's directory entry durable (best effort where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def open_writer(
    path: Path, kind: FileKind, *, fresh: bool, schema: Sequence[str], pragmas: Sequence[str]
) -> sqlite3.Connection:
    """The one writing connection of a file: WAL, synchronous=FULL, schema in place.

    `pragmas` run before the schema (auto_vacuum only takes before the first table).
    """
    error = kind.error
    try:
        conn = sqlite3.connect(path, isolation_level=None)
    except sqlite3.Error as exc:
        raise error(f"{path}: cannot open: {exc}") from exc
    try:
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise error(f"{path}: cannot switch to WAL mode (got {mode!r})")
        conn.execute("PRAGMA synchronous = FULL")
        for pragma in pragmas:
            conn.execute(f"PRAGMA {pragma}")
        conn.execute("BEGIN IMMEDIATE")
        for statement in schema:
            conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {kind.application_id}")
        conn.execute(f"PRAGMA user_version = {kind.schema_version}")
        conn.execute("COMMIT")
    except error:
        conn.close()
        raise
    except sqlite3.Error as exc:
        conn.close()
        raise error(f"{path}: cannot initialise: {exc}") from exc
    if fresh:
        fsync_dir(path.parent)
    return conn


# ---- the writer thread -------------------------------------------------------------------------


class Request:
    """One call waiting for a writer thread; `size` counts toward the batch bound."""

    __slots__ = ("future", "kind", "loop", "payload", "size")

    def __init__(self, kind: int, payload: Any, size: int) -> None:
        self.kind = kind
        self.payload = payload
        self.size = size
        self.loop: asyncio.AbstractEventLoop | None = None
        self.future: asyncio.Future[None] | None = None


Requests = queue.SimpleQueue[Request]

# A file's write record as a replication tap sees it, in call order. The tap answers a future
# that resolves once the backup holds it (None: nothing to wait for).
Record = TypeVar("Record")
Tap = Callable[[Record], "asyncio.Future[None] | None"]

SNAPSHOT = -1  # request kind every writer serves alike: pin a read snapshot at that point


class Pinned:
    """A read transaction pinned where a SNAPSHOT request stood in a file's write order: it
    sees every write enqueued before it and none after, while the writer goes on."""

    def __init__(self) -> None:
        self.conn: sqlite3.Connection | None = None

    def pin(self, path: Path) -> None:
        """On the writer thread, between two batches."""
        uri = path.resolve().as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the read starts here
        self.conn = conn

    def columns(self, table: str) -> tuple[str, ...]:
        """The names of `table`'s columns, in the order `rows` gives their values."""
        assert self.conn is not None
        return tuple(row[1] for row in self.conn.execute(f"PRAGMA table_info({table})"))

    def rows(self, table: str, chunk: int) -> Iterator[list[tuple[Any, ...]]]:
        """Every row of `table` in chunks (any thread, one at a time)."""
        assert self.conn is not None
        cursor = self.conn.execute(f"SELECT * FROM {table}")  # our own table names
        while rows := cursor.fetchmany(chunk):
            yield rows

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def start_writer(
    name: str,
    connect: Callable[[], sqlite3.Connection],
    serve: Callable[[sqlite3.Connection], None],
) -> threading.Thread:
    """A daemon thread that opens the file's writing connection, then serves requests on it.

    Returns once the connection is open; raises what `connect` raised. Daemon: whatever was
    committed is durable, and a stuck writer must never hang interpreter exit.
    """
    ready: concurrent.futures.Future[None] = concurrent.futures.Future()

    def run() -> None:
        try:
            conn = connect()
        except BaseException as exc:
            ready.set_exception(exc)
            return
        ready.set_result(None)
        serve(conn)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    ready.result()
    return thread


def enqueue(requests: Requests, request: Request) -> asyncio.Future[None]:
    """Hand a request to the writer thread; the future resolves once it is committed."""
    loop = asyncio.get_running_loop()
    request.loop = loop
    request.future = loop.create_future()
    requests.put(request)
    return request.future


def snapshot(requests: Requests) -> tuple[Pinned, asyncio.Future[None]]:
    """Enqueue a SNAPSHOT request: the writer pins a read of the file right after every
    request enqueued before it (the future resolves then) and before any enqueued after."""
    pinned = Pinned()
    return pinned, enqueue(requests, Request(SNAPSHOT, pinned, 0))


def take(requests: Requests, close: int, max_size: int) -> tuple[list[Request], Request | None]:
    """Block for one request, then take whatever else is queued, up to `max_size` in all.

    Returns the batch and, when a request of kind `close` or SNAPSHOT came, that request
    (last: it is served after the batch).
    """
    request = requests.get()
    batch: list[Request] = []
    size = 0
    while True:
        if request.kind in (close, SNAPSHOT):
            return batch, request
        batch.append(request)
        size += request.size
        if size >= max_size:
            return batch, None
        try:
            request = requests.get_nowait()
        except queue.Empty:
            return batch, None


def settle(batch: Sequence[Request], errors: Iterable[BaseException | None]) -> None:
    """Resolve a batch's waiters from the writer thread, each with its error or None."""
    hand_back((r.loop, r.future, e) for r, e in zip(batch, errors, strict=True))


# ---- handing results back from a writer thread ------------------------------------------------


def hand_back(outcomes: Iterable[Outcome]) -> None:
    """Resolve waiters in order, with one wake-up of a loop per run of requests from it.

    Called from a writer thread: every `call_soon_threadsafe` writes to the loop's self-pipe,
    so one per batch instead of one per request saves a syscall and a loop turn each.
    """
    items: Settled = []
    loop: asyncio.AbstractEventLoop | None = None
    for owner, future, error in outcomes:
        if future is None:
            continue
        if owner is not loop and items:
            _call_soon(loop, items)
            items = []
        loop = owner
        items.append((future, error))
    if items:
        _call_soon(loop, items)


def _call_soon(loop: asyncio.AbstractEventLoop | None, items: Settled) -> None:
    if loop is None:
        return
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
        loop.call_soon_threadsafe(_settle, items)


def _settle(items: Settled) -> None:
    """On the loop: resolve in call order; a cancelled waiter is simply skipped."""
    for future, error in items:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
