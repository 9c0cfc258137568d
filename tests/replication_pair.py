"""A real ha primary (`Replicator` over real stores, served over real gRPC) and a real backup
(`Follower` on real files) for the replication tests; the failover gate, the layer above them,
is the only fake."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpc import aio
from waiting import until

from broker import sqlite_file
from broker.message import Message
from broker.store import Store
from broker.store_files import STORE_FILE
from cluster.connector import SERVER_OPTIONS
from cluster.replica import SWAP_MARKER, SYNC_SUFFIX, Follower
from cluster.replication import Replicator
from handler.bindings import FILE_NAME as BINDINGS_FILE
from handler.bindings import BindingStore
from handler.records import Binding
from pinmq_pb import cluster_pb2_grpc as pb_grpc

QUEUE = "orders"
EPOCH = 1
WAIT_S = 30.0
LIMIT = 1 << 20  # MAX_QUEUED_BYTES for the test: 1 MiB instead of 256
BIG = 64 * 1024  # a message body: a few dozen past the transport's window reach the limit
MAX_WRITES = 1024  # 64 MiB: far more than the window and the limit; the drop comes long before


# ---- the layer above: the failover gate


class Gate:
    """The failover shell as replication sees it (`cluster.replication.Gate`, `PairShell`):
    a write no in-sync backup confirms is admitted only once the voters know the backup is not
    in sync; the voters hear it when the test calls `tell_voters` or, with `at_once`, at once."""

    def __init__(self, *, at_once: bool) -> None:
        self.epoch = EPOCH
        self.at_once = at_once
        self.backup_in_sync = False
        self.voters_know = True  # no backup was ever in sync
        self.synced = 0
        self.lost = 0
        self._waiting: list[asyncio.Future[None]] = []

    def may_serve(self) -> bool:
        return True

    def admit_alone(self) -> asyncio.Future[None] | None:
        if self.voters_know:
            return None
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        return future

    def backup_synced(self) -> None:
        self.synced += 1
        self.backup_in_sync = True
        self.voters_know = False  # they heard "in sync": a write without it must wait
        # The writes that waited to be acknowledged alone are on the backup now (PairShell).
        waiting, self._waiting = self._waiting, []
        for future in waiting:
            if not future.done():
                future.set_result(None)

    def backup_lost(self) -> None:
        self.lost += 1
        if self.backup_in_sync:
            self.backup_in_sync = False
            if self.at_once:
                self.tell_voters()

    def tell_voters(self) -> None:
        self.voters_know = True
        waiting, self._waiting = self._waiting, []
        for future in waiting:
            if not future.done():
                future.set_result(None)

    def peer_is(self, name: str, address: str) -> None:
        pass


# ---- a primary and a backup


class _Cluster(pb_grpc.ClusterServicer):
    def __init__(self, replicator: Replicator) -> None:
        self.replicator = replicator

    async def Replicate(self, request_iterator: Any, context: aio.ServicerContext) -> None:
        await self.replicator.serve(request_iterator, context)


@dataclass
class Primary:
    data_dir: Path
    store: Store
    bindings: BindingStore
    replicator: Replicator
    address: str
    next_id: int = 1

    async def send(self, count: int, body: bytes = b"m") -> None:
        """`count` messages, one write each, all awaited."""
        await asyncio.gather(*(self.write(body) for _ in range(count)))

    def write(self, body: bytes = b"m") -> Awaitable[None]:
        msg_id, self.next_id = self.next_id, self.next_id + 1
        message = Message(msg_id=msg_id, queue=QUEUE, address=QUEUE, body=body, persistent=True)
        return self.store.write([message])

    async def forget(self, *msg_ids: int) -> None:
        gone = [Message(i, QUEUE, QUEUE, b"", persistent=True) for i in msg_ids]
        await self.store.write(removed=gone)

    async def bind(self, *groups: str) -> None:
        await self.bindings.put(Binding(g, QUEUE, "node2", EPOCH) for g in groups)

    async def unbind(self, *groups: str) -> None:
        await self.bindings.delete((g, QUEUE) for g in groups)


@contextlib.asynccontextmanager
async def primary(data_dir: Path, gate: Gate) -> AsyncIterator[Primary]:
    store = Store.open(data_dir / STORE_FILE)
    bindings = BindingStore.open(data_dir / BINDINGS_FILE)
    sources = {"store": store, "bindings": bindings}
    replicator = Replicator(
        "node1", sources, failure_timeout_ms=600_000, gate=gate, commits=store.commit_ns
    )
    server = aio.server(options=SERVER_OPTIONS)  # the cluster listener's: keepalive policy
    pb_grpc.add_ClusterServicer_to_server(_Cluster(replicator), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        await store.save_queue(QUEUE, QUEUE, {})
        yield Primary(data_dir, store, bindings, replicator, f"127.0.0.1:{port}")
    finally:
        await server.stop(0)
        await store.close()
        await bindings.close()


class Backup:
    """A `Follower` (re)started on `data_dir`, and what it tells the failover shell. What it
    finds on disk is settled when it is built, as when its process starts."""

    def __init__(self, address: str, data_dir: Path) -> None:
        self.synced: list[int] = []
        self.broken = 0
        self.follower = Follower(
            "node1-backup", address, data_dir, retry_s=0.05, warn_after_s=WAIT_S,
            on_synced=self.synced.append, on_broken=self._broke,
        )  # fmt: skip

    def _broke(self) -> None:
        self.broken += 1


@contextlib.asynccontextmanager
async def running(b: Backup) -> AsyncIterator[Backup]:
    task = asyncio.create_task(b.follower.run())
    try:
        yield b
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await b.follower.close()


def contents(data_dir: Path) -> dict[str, list[Any]]:
    """Every row of every replicated table of the store and the bindings file."""
    found: dict[str, list[Any]] = {}
    for file, tables in ((STORE_FILE, Store.TABLES), (BINDINGS_FILE, BindingStore.TABLES)):
        conn = sqlite_file.read_only(data_dir / file)
        try:
            for table in tables:
                rows = conn.execute(f"SELECT * FROM {table}").fetchall()
                found[f"{file}:{table}"] = sorted(rows, key=repr)
        finally:
            conn.close()
    return found


def leftovers(data_dir: Path) -> list[str]:
    return sorted(
        p.name for p in data_dir.iterdir() if p.name == SWAP_MARKER or SYNC_SUFFIX in p.name
    )


async def in_sync(p: Primary, b: Backup) -> None:
    """The primary counts the backup in sync, and it confirmed every write so far."""
    await until(
        "the backup in sync",
        lambda: (
            p.replicator.status().get("backup_in_sync") and b.follower.durable == p.replicator.seq
        ),
    )
