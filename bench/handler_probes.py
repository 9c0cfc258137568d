"""The grouping handlers bench/cluster_decisions.py measures, and its timing loops.

A LOCAL handler (`handler.local.LocalHandler`, bindings in a SQLite file, durable before it
answers) hosted on a loopback `grpc.aio` server in a process of its own, driven over a pipe so
that its own node's decisions are timed inside it; and a REMOTE handler in the calling process
pointed at any LOCAL address (that process, or a real node's listen.cluster). Every call is
timed one by one; CPU per process is read around each scenario.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpc import aio
from harness.procs import die_with_parent, proc_cpu
from harness.stats import pct

from broker import logs
from broker.config import GroupingHandlerSection
from handler.local import LocalHandler
from handler.remote import RemoteHandler
from handler.service import GroupingServicer
from pinmq_pb import grouping_pb2 as gpb
from pinmq_pb import grouping_pb2_grpc as gpb_grpc

QUEUE = "orders"
REMOTE_NODE = "node2"
LOCAL_NODE = "node1"
DECISION_TIMEOUT_MS = 5000
WARMUP = 200
START_TIMEOUT_S = 30.0
COMMAND_TIMEOUT_S = 300.0
SCENARIO_TIMEOUT_S = 300.0


@dataclass(slots=True)
class Stats:
    """Per-call latencies (ns, sorted), wall time, and CPU seconds per process during it."""

    latencies: list[int]
    elapsed: float
    cpu: dict[str, float]
    commits: int = -1  # bindings-file commits during the run (LOCAL process only)

    def pct(self, q: float) -> int:
        return pct(self.latencies, q)

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.elapsed


async def measure(
    call: Callable[[str], Awaitable[object]], keys: Sequence[str], concurrency: int
) -> tuple[list[int], float]:
    """Await `call(key)` for every key, `concurrency` in flight; (sorted latencies, wall s)."""
    latencies: list[int] = []
    todo = iter(keys)
    clock = time.perf_counter_ns

    async def worker() -> None:
        for key in todo:  # one iterator shared by the workers
            t = clock()
            await call(key)
            latencies.append(clock() - t)

    start = time.perf_counter()
    async with asyncio.timeout(SCENARIO_TIMEOUT_S):
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    latencies.sort()
    return latencies, elapsed


def measure_sync(call: Callable[[str], object], keys: Sequence[str]) -> tuple[list[int], float]:
    """`call(key)` for every key, timed one by one; (sorted latencies, wall s)."""
    latencies = []
    clock = time.perf_counter_ns
    start = time.perf_counter()
    for key in keys:
        t = clock()
        call(key)
        latencies.append(clock() - t)
    elapsed = time.perf_counter() - start
    latencies.sort()
    return latencies, elapsed


def keys_for(tag: str, n: int) -> list[str]:
    return [f"{tag}-{i:07d}" for i in range(n)]


def local_main(data_dir: str, conn: Any) -> None:
    """Host a LocalHandler on a loopback gRPC server; run baseline commands sent over `conn`."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    logs.configure(LOCAL_NODE, "warning", "console")
    asyncio.run(_local(Path(data_dir), conn))


async def _local(data_dir: Path, conn: Any) -> None:
    section = GroupingHandlerSection(type="LOCAL", timeout=DECISION_TIMEOUT_MS)
    handler = LocalHandler(section, LOCAL_NODE, data_dir)
    await handler.start()
    server = aio.server()
    GroupingServicer(handler).add_to_server(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    store = handler._store  # private: read for its commit count only
    assert store is not None
    conn.send(("ready", port))
    try:
        while True:
            try:
                if not await asyncio.to_thread(conn.poll, 0.2):
                    continue
                command, *params = conn.recv()
            except (EOFError, OSError):
                return  # the parent is gone
            if command == "stop":
                return
            cpu0, commits0 = time.process_time(), store.commits
            if command == "new":
                tag, n, concurrency = params
                lat, elapsed = await measure(
                    lambda k: handler.decide(k, QUEUE, LOCAL_NODE), keys_for(tag, n), concurrency
                )
            elif command == "hit":
                tag, n = params
                lat, elapsed = await measure(
                    lambda k: handler.decide(k, QUEUE, LOCAL_NODE), keys_for(tag, n), 1
                )
            else:  # "cached"
                tag, n = params
                lat, elapsed = measure_sync(lambda k: handler.cached(k, QUEUE), keys_for(tag, n))
            cpu = {"LOCAL": time.process_time() - cpu0}
            conn.send(("done", Stats(lat, elapsed, cpu, store.commits - commits0)))
    finally:
        await server.stop(0.5)
        await handler.stop()


class LocalProcess:
    """The LOCAL handler's process, driven over a pipe."""

    def __init__(self, data_dir: Path) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=local_main, args=(str(data_dir), child), daemon=True)
        self.address = ""

    async def start(self) -> None:
        self.proc.start()
        kind, port = await self._reply(START_TIMEOUT_S)
        assert kind == "ready", kind
        self.address = f"127.0.0.1:{port}"

    async def run(self, *command: object) -> Stats:
        self.conn.send(command)
        kind, stats = await self._reply(COMMAND_TIMEOUT_S)
        assert kind == "done", kind
        return stats  # type: ignore[no-any-return]

    async def _reply(self, timeout: float) -> tuple[str, Any]:
        deadline = time.monotonic() + timeout
        while not await asyncio.to_thread(self.conn.poll, 0.2):
            if not self.proc.is_alive():
                raise RuntimeError(f"the LOCAL process died (exit code {self.proc.exitcode})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer from the LOCAL process in {timeout:.0f} s")
        return self.conn.recv()  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self.proc.is_alive():
            with suppress(OSError):
                self.conn.send(("stop",))
            self.proc.join(5)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)
        self.conn.close()


class Remote:
    """A RemoteHandler in this process, pointed at one LOCAL handler address."""

    def __init__(self, address: str, cpu_of: dict[str, int]) -> None:
        section = GroupingHandlerSection(type="REMOTE", timeout=DECISION_TIMEOUT_MS)
        self.handler = RemoteHandler(
            lambda: address, section, REMOTE_NODE, reconnect_interval_ms=200
        )
        self.cpu_of = cpu_of  # other processes whose CPU is read around each scenario

    async def start(self) -> None:
        await self.handler.start()
        async with asyncio.timeout(START_TIMEOUT_S):
            await self.handler.subscribed.wait()
        await measure(self._decide, keys_for("warmup", WARMUP), 1)

    async def _decide(self, key: str) -> object:
        return await self.handler.decide(key, QUEUE, REMOTE_NODE)

    def _cpu(self) -> dict[str, float]:
        return {"REMOTE": time.process_time(), **{k: proc_cpu(p) for k, p in self.cpu_of.items()}}

    def _stats(self, lat: list[int], elapsed: float, cpu0: dict[str, float]) -> Stats:
        cpu1 = self._cpu()
        return Stats(lat, elapsed, {k: cpu1[k] - cpu0[k] for k in cpu0})

    async def new(self, tag: str, n: int, concurrency: int) -> Stats:
        cpu0 = self._cpu()
        lat, elapsed = await measure(self._decide, keys_for(tag, n), concurrency)
        return self._stats(lat, elapsed, cpu0)

    async def hit(self, tag: str, n: int) -> Stats:
        cpu0 = self._cpu()
        lat, elapsed = await measure(self._decide, keys_for(tag, n), 1)
        return self._stats(lat, elapsed, cpu0)

    def cached(self, tag: str, n: int) -> Stats:
        cpu0 = self._cpu()
        lat, elapsed = measure_sync(lambda k: self.handler.cached(k, QUEUE), keys_for(tag, n))
        return self._stats(lat, elapsed, cpu0)

    async def stop(self) -> None:
        await self.handler.stop()


async def serves_grouping(address: str) -> str:
    """'' if `address` answers GroupingHandler.Propose, else why not."""
    async with aio.insecure_channel(address) as channel:
        stub = gpb_grpc.GroupingHandlerStub(channel)
        request = gpb.ProposeRequest(group="bench-probe", queue=QUEUE, node=REMOTE_NODE)
        try:
            await stub.Propose(request, timeout=DECISION_TIMEOUT_MS / 1000, wait_for_ready=True)
        except aio.AioRpcError as err:
            return f"{err.code().name}: {err.details()}"
    return ""
