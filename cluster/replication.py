"""ha, the primary's side of replication: every store write goes to the backup, in order.

The primary's two SQLite files (the message store and the bindings) hand every write record
to `Replicator` through their `tap`, in the order they apply it; it crosses the wire in the
stream's own format (`cluster/replication_wire.py`). A backup that connects
(`Cluster.Replicate`) first gets a snapshot: a SNAPSHOT request is enqueued in each file at
one sequence number, so each pins a read of exactly the writes up to it; the rows stream from
those reads while later writes queue for the backup behind them, paced by the primary's own
latency (`cluster/snapshot_pace.py`) so that its clients keep their service. Once the backup
has the snapshot on disk and is at most `SYNC_LAG` requests behind (or has everything, when
idle), every new write waits until the backup reports it durable too, and the backup counts
as in sync once it holds every write before the first that waited.

A backup that is gone, more than `MAX_QUEUED_BYTES` behind, or does not confirm a write within
`failure-timeout`, is dropped: what it was still to get is freed, its stream ends even if it
reads nothing more, and the writes that waited for it complete as any write it does not hold:
once the gate allows (the voters know it is out of sync). The primary carries on alone (logged,
and in health); the backup catches up again with a fresh snapshot.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, Protocol

import grpc
import structlog
from grpc import aio

from broker.engine import NotServing
from broker.futures import taken
from broker.histogram import Histogram
from broker.sqlite_file import Pinned
from cluster import replication_wire as wire
from cluster.latency_probe import LatencyProbe
from cluster.snapshot_pace import Pace
from pinmq_pb import cluster_pb2 as pb

log = structlog.get_logger(__name__)

SYNC_LAG = 1000  # requests behind at most when writes start waiting for the backup
ROWS_PER_FRAME = 1000
OPS_PER_FRAME = 500
FRAME_BYTES = 4 * 1024 * 1024  # a frame holds at most this much (or one row or op, if bigger)
MAX_QUEUED_BYTES = 256 * 1024 * 1024  # a backup further behind than that is dropped
BEFORE_S = 0.25  # the primary's latency is measured this long before a snapshot streams


class Source(Protocol):
    """A file the primary replicates: `broker.store.Store`, `handler.bindings.BindingStore`."""

    TABLES: tuple[str, ...]  # copied to a backup that catches up
    tap: Callable[[Any], asyncio.Future[None] | None] | None

    def snapshot(self) -> tuple[Pinned, asyncio.Future[None]]: ...


class BackupLost(Exception):
    """The backup went away or fell behind; the message says why."""


class Gate(Protocol):
    """What replication asks of the failover shell (cluster/ha.py `PairShell`)."""

    @property
    def epoch(self) -> int: ...

    def may_serve(self) -> bool: ...

    def admit_alone(self) -> asyncio.Future[None] | None: ...

    def backup_synced(self) -> None: ...

    def backup_lost(self) -> None: ...

    def peer_is(self, name: str, address: str) -> None: ...


class _Backup:
    """One connected backup: what it must still get, what it holds, and who waits for it."""

    def __init__(
        self, node_id: str, after: int, timeout_s: float, gate: Gate | None = None
    ) -> None:
        self.node_id = node_id
        self.gate = gate
        self.after = after  # the snapshot holds every write up to this sequence
        # Highest sequence the backup holds on disk; -1 until it has the snapshot: a snapshot
        # at 0 (a fresh primary) must not count as installed before the backup says so.
        self.durable = -1
        self.timeout_s = timeout_s
        self.queue: deque[pb.ReplicatedOp] = deque()
        self.queued_bytes = 0
        # Bytes of every write shipped to it, and (seq, that total) per write it has yet to
        # confirm: how many bytes it is behind, for metrics, without a walk.
        self.shipped_bytes = 0
        self.marks: deque[tuple[int, int]] = deque()
        self.confirmed_bytes = 0
        self.ready = asyncio.Event()  # something queued
        self.latest = after  # highest sequence shipped to it
        self.synced_at: int | None = None  # every write after this sequence waits for it
        self.waiting: deque[tuple[int, asyncio.Future[None], float]] = deque()
        self.lost: BackupLost | None = None
        self.gone = asyncio.Event()  # dropped: its stream ends

    @property
    def in_sync(self) -> bool:
        """It holds every write up to where writes began to wait for it."""
        return self.synced_at is not None and self.durable >= self.synced_at

    @property
    def behind_bytes(self) -> int:
        """Bytes of the writes shipped to it that it has not confirmed durable yet."""
        return self.shipped_bytes - self.confirmed_bytes

    def ship(self, op: pb.ReplicatedOp) -> asyncio.Future[None] | None:
        if self.lost is not None:
            return None
        self.queue.append(op)
        size = len(op.payload)
        self.queued_bytes += size
        self.shipped_bytes += size
        self.marks.append((op.seq, self.shipped_bytes))
        self.ready.set()
        if self.queued_bytes > MAX_QUEUED_BYTES:
            self.drop(f"more than {MAX_QUEUED_BYTES >> 20} MiB behind")
            return None
        self.latest = op.seq
        caught_up = self.durable >= self.after and op.seq - self.durable <= SYNC_LAG
        if self.synced_at is None and caught_up:
            self.synced_at = op.seq - 1
        if self.synced_at is None:
            return None
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((op.seq, future, time.monotonic()))
        return future

    def confirmed(self, durable: int) -> None:
        was = self.in_sync
        self.durable = max(self.durable, durable)
        marks = self.marks
        while marks and marks[0][0] <= self.durable:
            self.confirmed_bytes = marks.popleft()[1]
        if self.synced_at is None and self.durable >= self.latest:
            self.synced_at = self.latest  # idle and caught up: later writes wait for it
        while self.waiting and self.waiting[0][0] <= self.durable:
            _, future, _ = self.waiting.popleft()
            if not future.done():
                future.set_result(None)
        if self.in_sync and not was:
            log.info("backup in sync", backup=self.node_id, seq=self.durable)
            if self.gate is not None:
                self.gate.backup_synced()

    def overdue(self, now: float) -> bool:
        return bool(self.waiting) and now - self.waiting[0][2] > self.timeout_s

    def drop(self, reason: str) -> None:
        """Stop waiting for it and free what it was still to get. The writes that waited for
        it may not be acknowledged before the voters know it is out of sync (else it could be
        elected without them): they complete as the gate admits writes alone."""
        if self.lost is not None:
            return
        self.lost = BackupLost(reason)
        log.info("backup lost: carrying on without it", backup=self.node_id, reason=reason)
        if self.gate is not None:
            self.gate.backup_lost()
        self.queue.clear()
        self.queued_bytes = 0
        self.marks.clear()
        waiting = [future for _, future, _ in self.waiting]
        self.waiting.clear()
        if waiting:
            _admit_alone(self.gate, waiting)
        self.ready.set()
        self.gone.set()

    def take(self) -> list[pb.ReplicatedOp]:
        ops: list[pb.ReplicatedOp] = []
        size = 0
        while self.queue and len(ops) < OPS_PER_FRAME:
            if ops and size + len(self.queue[0].payload) > FRAME_BYTES:
                break
            op = self.queue.popleft()
            self.queued_bytes -= len(op.payload)
            size += len(op.payload)
            ops.append(op)
        if not self.queue:
            self.ready.clear()
        return ops


class Replicator:
    """The primary's replication: taps its store files and serves one backup at a time."""

    def __init__(
        self,
        node_id: str,
        sources: Mapping[str, Source],
        failure_timeout_ms: int,
        gate: Gate | None = None,
        commits: Histogram | None = None,
    ) -> None:
        self.node_id = node_id
        self.gate = gate  # ha failover: writes only while serving, alone only once voters know
        self.commits = commits  # the store's commit times: a snapshot streams by them
        self.sources = dict(sources)
        self.timeout_s = failure_timeout_ms / 1000
        self.seq = 0
        self.backup: _Backup | None = None
        for name, source in self.sources.items():
            source.tap = self._tap(name)

    def _tap(self, file: str) -> Callable[[wire.Record], asyncio.Future[None] | None]:
        def ship(record: wire.Record) -> asyncio.Future[None] | None:
            self.seq += 1
            gate, backup = self.gate, self.backup
            if gate is not None and not gate.may_serve():
                return _failed(NotServing(f"{self.node_id} does not hold its node now"))
            waiting = None
            if backup is not None:
                op = pb.ReplicatedOp(seq=self.seq, file=file, payload=wire.encode(record))
                waiting = backup.ship(op)
            if waiting is None and gate is not None:
                try:
                    return gate.admit_alone()  # no backup confirms it: the voters must know
                except Exception as err:
                    return _failed(err)
            return waiting

        return ship

    def status(self) -> dict[str, Any]:
        """For health: the backup, whether it is in sync, how far behind it is."""
        backup = self.backup
        if backup is None or backup.lost is not None:
            return {"backup": None, "backup_in_sync": False}
        return {
            "backup": backup.node_id,
            "backup_in_sync": backup.in_sync,
            "backup_behind": self.seq - max(backup.durable, backup.after),
            "backup_behind_bytes": backup.behind_bytes,
        }

    async def serve(
        self, reports: AsyncIterator[pb.ReplicaReport], context: aio.ServicerContext
    ) -> None:
        """The `Cluster.Replicate` stream of one backup: snapshot, then every write."""
        first = await anext(aiter(reports), None)
        if first is None or first.WhichOneof("report") != "hello":
            return
        if self.backup is not None:
            self.backup.drop("replaced by a new connection of the backup")
        hello = first.hello
        if self.gate is not None and hello.cluster_address:
            self.gate.peer_is(hello.node_id, hello.cluster_address)
        pins = {name: source.snapshot() for name, source in self.sources.items()}
        busy: dict[str, asyncio.Future[Any]] = {n: pinning for n, (_, pinning) in pins.items()}
        backup = self.backup = _Backup(hello.node_id, self.seq, self.timeout_s, self.gate)
        log.info("backup connected: sending a snapshot", backup=backup.node_id, seq=backup.after)
        receiving = asyncio.ensure_future(self._receive(backup, reports))
        watching = asyncio.ensure_future(self._watch(backup))
        gone = asyncio.ensure_future(backup.gone.wait())
        try:
            epoch = self.gate.epoch if self.gate is not None else 0
            begin = pb.SnapshotBegin(seq=backup.after, primary=self.node_id, epoch=epoch)
            await _write(context, pb.ReplicationFrame(begin=begin), gone)
            async with LatencyProbe(self.commits) as probe:
                await asyncio.sleep(BEFORE_S)
                pace, began = Pace(probe.take()), time.monotonic()
                for name, (pinned, _) in pins.items():
                    await asyncio.shield(busy[name])
                    await self._send_rows(
                        context, name, pinned, busy, gone, _Paced(pace, probe, backup)
                    )
                    pinned.close()
            await _write(context, pb.ReplicationFrame(end=pb.SnapshotEnd()), gone)
            log.info(
                "snapshot sent",
                backup=backup.node_id,
                took_s=round(time.monotonic() - began, 2),
                paced_s=round(pace.rested_s, 2),
                steps=pace.steps,
                loop_over_budget=pace.loop_over,
                commits_over_budget=pace.commits_over,
            )
            while backup.lost is None:
                await backup.ready.wait()
                ops = backup.take()
                if ops:
                    await _write(context, pb.ReplicationFrame(ops=pb.ReplicatedOps(ops=ops)), gone)
        except BackupLost:
            pass
        except (asyncio.CancelledError, aio.AioRpcError, ConnectionError) as err:
            backup.drop(f"stream ended: {err!r}")
            raise
        finally:
            for name, (pinned, _) in pins.items():
                _close_when_idle(pinned, busy[name])
            receiving.cancel()
            watching.cancel()
            gone.cancel()
            backup.drop("stream ended")
            if self.backup is backup:
                self.backup = None
        # Dropped: the stream ends now, whether or not the backup reads; it hears why once it
        # has read what was already on the way, and starts again with a fresh snapshot.
        await context.abort(grpc.StatusCode.ABORTED, f"dropped by the primary: {backup.lost}")

    async def _send_rows(
        self,
        context: aio.ServicerContext,
        file: str,
        pinned: Pinned,
        busy: dict[str, asyncio.Future[Any]],
        gone: asyncio.Future[Any],
        paced: _Paced,
    ) -> None:
        """Every row of the file's tables, resting between chunks as `paced` says. Each read
        runs on a thread, shielded and noted in `busy`: a cancelled stream must not close the
        pin under it (SQLite then crashes)."""
        for table in self.sources[file].TABLES:
            columns = await _read(busy, file, pinned.columns, table)
            chunks: Iterator[list[tuple[Any, ...]]] = pinned.rows(table, ROWS_PER_FRAME)
            while True:
                began = time.monotonic()
                rows = await _read(busy, file, next, chunks, None)
                if not rows:
                    break
                for run in _runs(rows):
                    chunk = wire.SnapshotChunk(file, table, columns, run)
                    frame = pb.ReplicationFrame(rows=wire.encode_chunk(chunk))
                    await _write(context, frame, gone)
                await paced.rest(time.monotonic() - began, gone)

    async def _receive(self, backup: _Backup, reports: AsyncIterator[pb.ReplicaReport]) -> None:
        try:
            async for report in reports:
                if report.WhichOneof("report") == "durable":
                    backup.confirmed(report.durable)
        except aio.AioRpcError:
            pass
        backup.drop("the backup closed the stream")

    async def _watch(self, backup: _Backup) -> None:
        while backup.lost is None:
            await asyncio.sleep(min(0.1, self.timeout_s / 4))
            if backup.overdue(time.monotonic()):
                backup.drop(f"no confirmation within {self.timeout_s * 1000:.0f} ms")


class _Paced:
    """A snapshot's pace (`cluster/snapshot_pace.py`) with what it is measured by."""

    def __init__(self, pace: Pace, probe: LatencyProbe, backup: _Backup) -> None:
        self.pace, self.probe, self.backup = pace, probe, backup

    async def rest(self, worked_s: float, gone: asyncio.Future[Any]) -> None:
        """After a step that took `worked_s`: rest as long as the pace says (less if the
        backup is dropped meanwhile)."""
        rest = self.pace.rest(worked_s, self.probe.take(), self.backup.queued_bytes)
        if rest > 0:
            await asyncio.wait((gone,), timeout=rest)


async def _write(
    context: aio.ServicerContext, frame: pb.ReplicationFrame, gone: asyncio.Future[Any]
) -> None:
    """One frame to the backup, given up if it is dropped meanwhile: a backup that reads
    nothing more would otherwise hold this stream, and everything queued for it, forever.
    Raises `BackupLost` then (a frame given up reaches the backup whole or not at all)."""
    if gone.done():
        raise BackupLost("dropped")
    writing = asyncio.ensure_future(context.write(frame))
    # Its outcome is taken even if nobody awaits it: gRPC may fail a write it was told to
    # drop, or fail it just as this stream is cancelled.
    writing.add_done_callback(taken)
    try:
        await asyncio.wait((writing, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        given_up = not writing.done()
        if given_up:
            writing.cancel()
    if given_up:
        raise BackupLost("dropped while a frame was on its way")
    writing.result()  # what the write raised, if it failed


async def _read(busy: dict[str, asyncio.Future[Any]], file: str, *call: Any) -> Any:
    """`call` on a thread, shielded and noted in `busy` as the pinned read of `file` in use."""
    busy[file] = reading = asyncio.ensure_future(asyncio.to_thread(*call))
    return await asyncio.shield(reading)


def _runs(rows: list[tuple[Any, ...]]) -> Iterator[list[tuple[Any, ...]]]:
    """`rows` in runs of about `FRAME_BYTES` at most (one row, if bigger): a frame must fit
    gRPC's and protobuf's limits, and big messages come a thousand to a chunk."""
    run: list[tuple[Any, ...]] = []
    size = 0
    for row in rows:
        n = sum(len(v) for v in row if isinstance(v, bytes | str))
        if run and size + n > FRAME_BYTES:
            yield run
            run, size = [], 0
        run.append(row)
        size += n
    if run:
        yield run


def _close_when_idle(pinned: Pinned, busy: asyncio.Future[Any]) -> None:
    """Close a pinned read once nothing uses it: not under a read on another thread, and not
    before the writer pinned it (a pin taken after its close would hold the WAL forever)."""

    def close(done: asyncio.Future[Any]) -> None:
        if not done.cancelled():
            done.exception()  # retrieved: nobody else will
        pinned.close()

    if busy.done():
        close(busy)
    else:
        busy.add_done_callback(close)


def _admit_alone(gate: Gate | None, futures: list[asyncio.Future[None]]) -> None:
    """Complete `futures` (writes the backup may not hold) as the gate admits writes alone."""
    try:
        alone = None if gate is None else gate.admit_alone()
    except Exception as err:
        alone = _failed(err)
    for future in futures:
        if alone is None:
            if not future.done():
                future.set_result(None)
        else:
            alone.add_done_callback(lambda done, future=future: _copy(done, future))


def _copy(source: asyncio.Future[None], target: asyncio.Future[None]) -> None:
    error = None if source.cancelled() else source.exception()  # retrieved in any case
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif error is not None:
        target.set_exception(error)
    else:
        target.set_result(None)


def _failed(error: BaseException) -> asyncio.Future[None]:
    future = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return future
