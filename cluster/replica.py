"""ha, the backup's side of replication: follow the primary's stores into our own files.

The backup connects to its primary's `Cluster.Replicate`, receives a snapshot of the store and
the bindings file, writes it to fresh files beside the real ones and swaps them in only once
complete (a snapshot cut short leaves the old files or nothing, never half of one). Then it
applies every write request the primary makes, in order, through the same writer threads the
node uses, and reports the highest sequence it holds on disk: the primary's writes wait for
that once the backup is in sync. A broken stream is retried with a fresh snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack
import structlog
from grpc import aio

from broker import channels, sqlite_file
from broker.engine import STORE_FILE
from broker.store import Store, StoreError
from handler.bindings import FILE_NAME as BINDINGS_FILE
from handler.bindings import BindingStore, BindingStoreError
from pinmq_pb import cluster_pb2 as pb
from pinmq_pb import cluster_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

SYNC_SUFFIX = ".sync"  # a snapshot being received, beside the file it will replace


class Follower:
    """Follows one primary into `data_dir`; `run` until cancelled, then `close`.

    `on_synced(epoch)` hears when a snapshot of the active of that epoch is on disk,
    `on_broken()` when the stream broke off (a catch-up is needed again).
    """

    def __init__(
        self,
        node_id: str,
        primary: str,
        data_dir: Path,
        retry_s: float,
        *,
        cluster_address: str = "",
        on_synced: Callable[[int], None] | None = None,
        on_broken: Callable[[], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.primary = primary
        self.retry_s = retry_s
        self.cluster_address = cluster_address
        self.on_synced = on_synced
        self.on_broken = on_broken
        self.paths = {"store": data_dir / STORE_FILE, "bindings": data_dir / BINDINGS_FILE}
        self.state = "connecting"  # connecting | receiving snapshot | following
        self.primary_id: str | None = None
        self.durable = 0  # highest sequence of the primary's writes on our disk
        self._stores: dict[str, Store | BindingStore] = {}
        self._bulk: dict[str, sqlite3.Connection] = {}

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
                detail = err.details() if isinstance(err, aio.AioRpcError) else str(err)
                log.warning(
                    "replication from the primary broke off", primary=self.primary, error=detail
                )
            self.state = "connecting"
            if self.on_broken is not None:
                self.on_broken()
            await self._close_bulk()
            await asyncio.sleep(self.retry_s)

    async def close(self) -> None:
        await self._close_bulk()
        await self._close_stores()

    async def _follow(self) -> None:
        reports: asyncio.Queue[pb.ReplicaReport] = asyncio.Queue()
        applied: deque[tuple[int, asyncio.Future[None]]] = deque()
        woken = asyncio.Event()
        async with aio.insecure_channel(
            self.primary, options=channels.keepalive() + channels.reconnect()
        ) as channel:
            call = pb_grpc.ClusterStub(channel).Replicate(self._reports(reports))
            confirming = asyncio.ensure_future(self._confirm(applied, woken, reports))
            try:
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
                        log.info(
                            "snapshot installed: following the primary",
                            primary=self.primary_id,
                            seq=after,
                        )
                        reports.put_nowait(pb.ReplicaReport(durable=after))
                        if self.on_synced is not None:
                            self.on_synced(epoch)
            finally:
                confirming.cancel()

    async def _reports(
        self, reports: asyncio.Queue[pb.ReplicaReport]
    ) -> AsyncIterator[pb.ReplicaReport]:
        hello = pb.ReplicaHello(node_id=self.node_id, cluster_address=self.cluster_address)
        yield pb.ReplicaReport(hello=hello)
        while True:
            yield await reports.get()

    # ---- the snapshot

    async def _begin(self) -> None:
        """Fresh files beside the real ones, with the schema of their kind, open for rows."""
        self.state = "receiving snapshot"
        await self._close_stores()
        await self._close_bulk()
        for name, path in self.paths.items():
            tmp = _sync_path(path)
            _remove(tmp)
            opened = Store.open(tmp) if name == "store" else BindingStore.open(tmp)
            await opened.close()
            conn = sqlite3.connect(tmp, check_same_thread=False)
            conn.execute("BEGIN")
            self._bulk[name] = conn

    async def _rows(self, rows: pb.SnapshotRows) -> None:
        conn = self._bulk[rows.file]
        data = msgpack.unpackb(rows.rows, use_list=False, raw=False)
        if data:
            marks = ",".join("?" * len(data[0]))
            sql = f"INSERT OR REPLACE INTO {rows.table} VALUES ({marks})"
            await asyncio.to_thread(conn.executemany, sql, data)

    async def _install(self) -> None:
        """Commit the snapshot files, then swap each in for its real file and open it."""
        bulk, self._bulk = self._bulk, {}
        await asyncio.to_thread(_swap_in, bulk, self.paths)
        self._stores = {
            "store": Store.open(self.paths["store"]),
            "bindings": BindingStore.open(self.paths["bindings"]),
        }

    # ---- the stream of writes

    def _apply(
        self, ops: Sequence[pb.ReplicatedOp], applied: deque[tuple[int, asyncio.Future[None]]]
    ) -> None:
        for op in ops:
            payload = msgpack.unpackb(op.payload, use_list=False, raw=False)
            applied.append((op.seq, self._stores[op.file].replay(op.kind, payload)))

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


def _sync_path(path: Path) -> Path:
    return path.with_name(path.name + SYNC_SUFFIX)


def _remove(path: Path) -> None:
    """A SQLite file with its WAL and shared-memory files."""
    for p in (path, sqlite_file.wal_path(path), path.with_name(path.name + "-shm")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _swap_in(bulk: dict[str, sqlite3.Connection], paths: dict[str, Path]) -> None:
    """Make each snapshot file whole and durable, then put it where its real file was."""
    for name, conn in bulk.items():
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        conn.close()
        path = paths[name]
        tmp = _sync_path(path)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        _remove(path)  # its WAL must not be replayed onto the new file
        os.replace(tmp, path)
        _remove(tmp)
        sqlite_file.fsync_dir(path.parent)
