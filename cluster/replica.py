"""ha, the backup's side of replication: follow the primary's stores into our own files.

The backup connects to its primary's `Cluster.Replicate`, receives a snapshot of the store and
the bindings file, writes it to fresh files beside the real ones and swaps them in only once
complete. The swap of the two files is one step even across a crash: it starts only once every
new file is whole and durable, under a marker file, and `recover` finishes a swap the marker
shows begun, or drops the partial files of one that was not; so the real files always hold one
whole snapshot, the old or the new, never the store of one and the bindings of the other (the
data a restarted backup is elected on, see `Durable.data_epoch`). Then it
applies every write record the primary makes, in order, through the same writer threads the
node uses, and reports the highest sequence it holds on disk: the primary's writes wait for
that once the backup is in sync. A broken stream is retried with a fresh snapshot.

A frame this backup cannot read (`cluster/replication_wire.py`: another format, from a primary
of another version) is refused before any of it is applied: the backup stops following, out
of sync, and says why once; it follows again once restarted (or made to follow anew).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog
from grpc import aio

from broker import channels, sqlite_file
from broker.futures import taken
from broker.kept_index import KeptIndex
from broker.store import Store, StoreError
from broker.store_files import STORE_FILE
from broker.tls import TlsFiles
from cluster import replication_wire as wire
from cluster.outage import Outage, raise_if_cancelled
from handler.bindings import FILE_NAME as BINDINGS_FILE
from handler.bindings import BindingStore, BindingStoreError
from pinmq_pb import cluster_pb2 as pb
from pinmq_pb import cluster_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

SYNC_SUFFIX = ".sync"  # a snapshot being received, beside the file it will replace
SWAP_MARKER = "replica-swap"  # in the data dir while whole snapshot files replace the real ones
# Snapshot rows written between flushes of their file's WAL: left to the kernel, a snapshot's
# hundreds of MiB are written back in bursts that every fsync on the disk waits behind (the
# primary's own commits, where both share it), see bench/RESULTS.md.
FLUSH_BYTES = 4 * 1024 * 1024
# One write request can be bigger than gRPC's default 4 MiB (limits.max-message-size is 10 MiB).
CHANNEL_OPTIONS = [
    *channels.keepalive(),
    *channels.reconnect(),
    ("grpc.max_receive_message_length", -1),
]


class Follower:
    """Follows one primary into `data_dir`; `run` until cancelled, then `close`.

    `on_synced(epoch)` hears when a snapshot of the active of that epoch is on disk,
    `on_broken()` when the stream broke off (a catch-up is needed again). A stream that
    stays broken off (no snapshot installed) for `warn_after_s` is worth a warning.
    """

    def __init__(
        self,
        node_id: str,
        primary: str,
        data_dir: Path,
        retry_s: float,
        *,
        warn_after_s: float,
        cluster_address: str = "",
        tls: TlsFiles | None = None,
        on_synced: Callable[[int], None] | None = None,
        on_broken: Callable[[], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.primary = primary
        self.retry_s = retry_s
        self.warn_after_s = warn_after_s
        self.cluster_address = cluster_address
        self.tls = tls  # mutual TLS with the primary, when the node has tls
        self.on_synced = on_synced
        self.on_broken = on_broken
        self.paths = _paths(data_dir)
        recover(data_dir)  # before anything opens the files
        self.state = "connecting"  # connecting | receiving snapshot | following | refused
        self.primary_id: str | None = None
        self.durable = 0  # highest sequence of the primary's writes on our disk
        self._stores: dict[str, Store | BindingStore] = {}
        # The index of the messages on our disk (broker/kept_index.py), kept as they come: a
        # takeover pages from it. None while it may not match the files (a store failed).
        self.index: KeptIndex | None = None
        self._incoming: KeptIndex | None = None  # the index of the snapshot being received
        self._bulk: dict[str, sqlite3.Connection] = {}
        self._unflushed: dict[str, int] = {}  # per snapshot file, bytes since its WAL's flush
        self._outage = Outage()  # a primary that is not active (yet) refuses every retry
        self._broken_at: float | None = None  # the stream broke off then, none installed since
        self._warned = False

    def status(self) -> dict[str, Any]:
        return {
            "primary": self.primary_id or self.primary,
            "replication": self.state,
            "durable_seq": self.durable,
        }

    async def run(self) -> None:
        while True:
            try:
                await self._follow()
            except (aio.AioRpcError, OSError, sqlite3.Error, StoreError, BindingStoreError) as err:
                raise_if_cancelled()
                if not isinstance(err, aio.AioRpcError):  # what our files hold is not sure
                    self.index = None
                self._broke_off(err.details() if isinstance(err, aio.AioRpcError) else str(err))
            self.state = "connecting"
            if self.on_broken is not None:
                self.on_broken()
            await self._close_bulk()
            await asyncio.sleep(self.retry_s)

    async def close(self) -> None:
        await self._close_bulk()
        await self._close_stores()

    def _broke_off(self, error: str) -> None:
        """Each failure once per outage, at info: normal while the pair elects or the
        primary restarts; a warning once, if no snapshot was installed for `warn_after_s`."""
        now = time.monotonic()
        if self._broken_at is None:
            self._broken_at = now
        if self._outage.news(error):
            log.info("replication from the primary broke off", primary=self.primary, error=error)
        since = self._broken_at
        if now - since >= self.warn_after_s and not self._warned:
            self._warned = True
            log.warning(
                "replication from the primary broken off for long",
                primary=self.primary,
                seconds=round(now - since, 1),
                error=error,
            )

    async def _follow(self) -> None:
        try:
            await self._stream()
        except wire.WireError as err:
            await self._refuse(err)

    async def _refuse(self, err: wire.WireError) -> None:
        """Stop following for good: this backup cannot read its primary (the stream is
        closed, so the primary carries on alone); returns only when cancelled."""
        self.state = "refused"
        log.error(
            "replication refused: cannot read the primary's stream; stopped following",
            primary=self.primary_id or self.primary,
            error=str(err),
        )
        if self.on_broken is not None:
            self.on_broken()
        await self._close_bulk()
        await self._close_stores()
        await asyncio.Event().wait()

    async def _stream(self) -> None:
        reports: asyncio.Queue[pb.ReplicaReport] = asyncio.Queue()
        applied: deque[tuple[int, asyncio.Future[None]]] = deque()
        woken = asyncio.Event()
        async with channels.dial(self.primary, CHANNEL_OPTIONS, self.tls) as channel:
            call = pb_grpc.ClusterStub(channel).Replicate()
            reporting = asyncio.ensure_future(self._report(call, reports))
            confirming = asyncio.ensure_future(self._confirm(applied, woken, reports))
            reading = asyncio.ensure_future(self._read(call, applied, woken, reports))
            try:
                # Either ends it: the primary's stream, or a write our disk refused (full,
                # say). Then the stream closes at once, so the primary drops us now rather
                # than after its failure-timeout with its writes waiting for us.
                done, _ = await asyncio.wait(
                    (reading, confirming), return_when=asyncio.FIRST_COMPLETED
                )
                failed = [err for err in (task.exception() for task in done) if err is not None]
                if failed:
                    raise failed[0]
            finally:
                for task in (reading, confirming, reporting):
                    task.cancel()
                    # One may have failed just as this stream was cancelled (the follower
                    # stops): its error is taken, not left for asyncio to log.
                    task.add_done_callback(taken)
                for _, write in applied:  # after one failed, those behind it are not waited for
                    write.add_done_callback(taken)

    async def _read(
        self,
        call: aio.StreamStreamCall,
        applied: deque[tuple[int, asyncio.Future[None]]],
        woken: asyncio.Event,
        reports: asyncio.Queue[pb.ReplicaReport],
    ) -> None:
        """Every frame of the primary's stream: the snapshot, then its writes."""
        after = epoch = 0
        async for frame in call:
            kind = frame.WhichOneof("frame")
            if kind == "ops":
                self._apply(frame.ops.ops, applied)
                woken.set()
            elif kind == "rows":
                await self._rows(frame.rows)
            elif kind == "begin":
                after, epoch = frame.begin.seq, frame.begin.epoch
                self.primary_id = frame.begin.primary
                await self._begin()
            elif kind == "end":
                await self._install()
                self.durable = after
                self.state = "following"
                self._outage.over()  # its end: the line below
                self._broken_at, self._warned = None, False
                log.info(
                    "snapshot installed: following the primary",
                    primary=self.primary_id,
                    seq=after,
                )
                reports.put_nowait(pb.ReplicaReport(durable=after))
                if self.on_synced is not None:
                    self.on_synced(epoch)

    async def _report(
        self, call: aio.StreamStreamCall, reports: asyncio.Queue[pb.ReplicaReport]
    ) -> None:
        """Our side of the stream, written by a task of ours that ends with it (a request
        iterator left to gRPC outlived a broken stream and logged an error when collected)."""
        hello = pb.ReplicaHello(node_id=self.node_id, cluster_address=self.cluster_address)
        try:
            await call.write(pb.ReplicaReport(hello=hello))
            while True:
                await call.write(await reports.get())
        except (aio.AioRpcError, aio.UsageError, asyncio.InvalidStateError):
            return  # the stream ended: the reading side says why

    # ---- the snapshot

    async def _begin(self) -> None:
        """Fresh files beside the real ones, with the schema of their kind, open for rows."""
        self.state = "receiving snapshot"
        await self._close_stores()
        await self._close_bulk()
        await asyncio.to_thread(_settle_swap, self.paths)  # an install that failed midway
        for name, path in self.paths.items():
            tmp = _sync_path(path)
            opened = Store.open(tmp) if name == "store" else BindingStore.open(tmp)
            await opened.close()
            conn = sqlite3.connect(tmp, check_same_thread=False)
            conn.execute("BEGIN")
            self._bulk[name] = conn
        self._incoming = KeptIndex()
        self._unflushed = {}

    async def _rows(self, rows: pb.SnapshotRows) -> None:
        chunk = wire.decode_chunk(rows)
        conn = self._bulk[chunk.file]
        if chunk.file == "store" and chunk.table == "messages" and self._incoming is not None:
            self._incoming.add_rows(chunk.columns, chunk.rows)
        if chunk.rows:
            names = ", ".join(map(_quoted, chunk.columns))
            marks = ", ".join("?" * len(chunk.columns))
            sql = f"INSERT OR REPLACE INTO {_quoted(chunk.table)} ({names}) VALUES ({marks})"
            await asyncio.to_thread(_insert, conn, sql, chunk.rows)
        unflushed = self._unflushed.get(chunk.file, 0) + rows.ByteSize()
        if unflushed >= FLUSH_BYTES:
            wal = sqlite_file.wal_path(_sync_path(self.paths[chunk.file]))
            await asyncio.to_thread(_flush, wal)
            unflushed = 0
        self._unflushed[chunk.file] = unflushed

    async def _install(self) -> None:
        """Commit the snapshot files, then swap each in for its real file and open it."""
        bulk, self._bulk = self._bulk, {}
        incoming, self._incoming = self._incoming, None
        self.index = None  # the files change from here on
        await asyncio.to_thread(_swap_in, bulk, self.paths)
        self._stores = {
            "store": Store.open(self.paths["store"]),
            "bindings": BindingStore.open(self.paths["bindings"]),
        }
        self.index = incoming

    # ---- the stream of writes

    def _apply(
        self, ops: Sequence[pb.ReplicatedOp], applied: deque[tuple[int, asyncio.Future[None]]]
    ) -> None:
        records = [(op.seq, op.file, wire.decode(op.payload)) for op in ops]  # all, or none
        index = self.index
        for seq, file, record in records:
            applied.append((seq, self._stores[file].apply(record)))
            if index is not None and file == "store":
                index.apply(record)

    async def _confirm(
        self,
        applied: deque[tuple[int, asyncio.Future[None]]],
        woken: asyncio.Event,
        reports: asyncio.Queue[pb.ReplicaReport],
    ) -> None:
        """Report what is on disk, in order, one report per run of writes that completed."""
        while True:
            await woken.wait()
            woken.clear()
            while applied:
                seq, future = applied[0]
                await future
                applied.popleft()
                self.durable = seq
                if not applied or not applied[0][1].done():
                    reports.put_nowait(pb.ReplicaReport(durable=seq))

    async def _close_stores(self) -> None:
        stores, self._stores = self._stores, {}
        for store in stores.values():
            await store.close()

    async def _close_bulk(self) -> None:
        bulk, self._bulk = self._bulk, {}
        for conn in bulk.values():
            with contextlib.suppress(sqlite3.Error):
                conn.close()


def recover(data_dir: Path) -> None:
    """After a crash, before the files are opened: leave one whole snapshot in place. Safe to
    call whenever no follower writes to `data_dir`."""
    _settle_swap(_paths(data_dir))


def _paths(data_dir: Path) -> dict[str, Path]:
    return {"store": data_dir / STORE_FILE, "bindings": data_dir / BINDINGS_FILE}


def _insert(conn: sqlite3.Connection, sql: str, rows: Sequence[Any]) -> None:
    """executemany with its cursor closed in this thread: a cursor freed later in the loop's
    thread resets the cached statement the next executemany runs (SQLITE_MISUSE)."""
    conn.executemany(sql, rows).close()


def _flush(path: Path) -> None:
    """What is written of a file so far, to disk (its data: `fdatasync`); none yet, if it is
    not there (SQLite has not spilled the transaction to its WAL)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _quoted(name: str) -> str:
    """A table or column name from the primary as an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def _sync_path(path: Path) -> Path:
    return path.with_name(path.name + SYNC_SUFFIX)


def _sidecars(path: Path) -> tuple[Path, Path]:
    """A SQLite file's WAL and shared-memory files."""
    return sqlite_file.wal_path(path), path.with_name(path.name + "-shm")


def _remove(path: Path) -> None:
    """A SQLite file with its WAL and shared-memory files."""
    for p in (path, *_sidecars(path)):
        p.unlink(missing_ok=True)


def _settle_swap(paths: dict[str, Path]) -> None:
    """Finish a swap that began (its marker is there), else drop any partial snapshot."""
    directory = next(iter(paths.values())).parent
    if (directory / SWAP_MARKER).exists():
        log.warning("finishing the install of a snapshot that was cut short", path=str(directory))
        _finish_swap(paths)
    else:
        for path in paths.values():
            _remove(_sync_path(path))


def _swap_in(bulk: dict[str, sqlite3.Connection], paths: dict[str, Path]) -> None:
    """Make every snapshot file whole and durable, then mark the swap begun and put each in
    place of its real file: a crash before the mark leaves the old files, after it `recover`
    puts the rest of the new ones in place."""
    for name, conn in bulk.items():
        _seal(conn, _sync_path(paths[name]))
    directory = next(iter(paths.values())).parent
    sqlite_file.fsync_dir(directory)  # the snapshot files' names, before the mark that needs them
    _mark(directory)
    _finish_swap(paths)


def _seal(conn: sqlite3.Connection, tmp: Path) -> None:
    """Commit a snapshot file, fold its WAL in and make it durable on its own."""
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    conn.close()
    for p in _sidecars(tmp):
        p.unlink(missing_ok=True)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())


def _mark(directory: Path) -> None:
    marker = directory / SWAP_MARKER
    with open(marker, "wb") as f:
        os.fsync(f.fileno())
    sqlite_file.fsync_dir(directory)


def _finish_swap(paths: dict[str, Path]) -> None:
    """Put every snapshot file still beside its real file in its place, then drop the mark.
    Idempotent: a crash anywhere in it is finished by running it again."""
    for path in paths.values():
        if _sync_path(path).exists():
            _put_in_place(path)
        else:  # already in place; nothing opened it yet, so WAL files are the old file's
            for p in _sidecars(path):
                p.unlink(missing_ok=True)
    directory = next(iter(paths.values())).parent
    sqlite_file.fsync_dir(directory)  # every rename, before the mark goes
    _unmark(directory)


def _put_in_place(path: Path) -> None:
    for p in _sidecars(path):  # the old file's WAL must not be replayed onto the new file
        p.unlink(missing_ok=True)
    os.replace(_sync_path(path), path)


def _unmark(directory: Path) -> None:
    (directory / SWAP_MARKER).unlink(missing_ok=True)
    sqlite_file.fsync_dir(directory)
