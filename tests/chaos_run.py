"""The chaos run: the compose cluster with every node paired (docker-compose.ha-all.yml), the
drills' audited grouped load (tests/ha_load.py: the Python client and stomp.py, every client
with its pair's addresses), and a nemesis that carries out a seeded schedule of overlapping
faults (tests/nemesis.py), every container's data on a small disk of its own that the
nemesis fills to its limit now and then (tests/disk_images.py). It ends with every fault
undone, every pair in sync, every confirmed message acked, and `pinmq check` over every audit
log: 0 lost, 0 duplicates, 0 order and 0 exclusivity violations, or the run fails printing
its seed and schedule.

Then availability per group, from the check's group stalls (a second or more between two of a
group's first deliveries while the load sends to it every few tens of milliseconds): the
longest stall of each group, the share of the run it was served, and the faults that held
while its longest stall lasted. Run by bench/chaos.py (`make chaos`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import waiting
from compose_nodes import HA_ALL, ComposeCluster
from consumer_waits import where
from disk_images import Disk, disks
from ha_load import PY_GROUPS, QUEUE, HaLoad
from nemesis import Fault, schedule, waits_for
from watchdog import watchdog

from broker.client import PinmqError

TURNS = 20  # messages per group per round of the load (each round a new producer)
PAUSE_S = 0.05  # between two sends of a group
BOUND_S = 900.0  # beyond the run itself: up, settle, drain and check; past it, a hang
DRAIN_S = 60.0  # after the confirmed messages are acked, for the queues to empty
DISK_MB = 256  # each container's data disk: a fill takes what the store leaves of it


async def chaos(
    workdir: Path,
    image: str,
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
    seconds: float,
    say: Callable[[str], None] = print,
) -> tuple[ChaosRun, dict[str, Any]]:
    """A whole run in `workdir`: the cluster up, the load, the faults, the verdict, the
    cluster removed (its containers' logs kept in containers.log). On failure the seed and
    the schedule are printed first."""
    with disks(workdir, HA_ALL, DISK_MB) as made:
        data = {name: disk.mount for name, disk in made.items()}
        cluster = ComposeCluster(workdir, image, monkeypatch, ha_all=True, data=data)
        load = HaLoad(cluster, workdir / "history", cluster.access)
        faults = schedule(seed, seconds, HA_ALL, disks=HA_ALL)
        run = ChaosRun(cluster, load, faults, seconds, seed, say, disks=made)
        say(run.plan())
        try:
            async with watchdog(seconds + BOUND_S, f"the chaos run of seed {seed}"):
                try:
                    await asyncio.to_thread(cluster.start)
                    await load.start()
                    stats = await run.run(workdir / "report")
                finally:
                    await load.close()
        except BaseException:
            replay = f"make chaos SEED={seed} MINUTES={seconds / 60:g}"
            say(f"FAILED: {run.plan()}\nreplay: {replay}")
            raise
        finally:
            logs = await asyncio.to_thread(cluster.compose, "logs", "--no-color", "-t")
            (workdir / "containers.log").write_text(logs)
            await asyncio.to_thread(cluster.down)
    # asyncio's own error records (a future's error nobody took, a callback that raised) are
    # bugs, whatever the faults: none in any container's log.
    unhandled = [line for line in logs.splitlines() if '"logger": "asyncio"' in line]
    assert not unhandled, f"{len(unhandled)} asyncio errors, the first: {unhandled[0][:2000]}"
    return run, stats


def table(rows: list[dict[str, Any]]) -> str:
    """The availability rows as text, one group a line."""
    lines = [f"{'group':<12} {'longest stall':>14} {'served':>8}  faults during its longest stall"]
    for r in rows:
        causes = "; ".join(r["faults"]) or "-"
        stall = r["longest_stall_ms"] / 1000
        lines.append(f"{r['group']:<12} {stall:>12.2f} s {r['served']:>8.1%}  {causes}")
    return "\n".join(lines)


SETTLE_S = 240.0  # after the last fault: every container back, every pair in sync
CAUSE_SLACK_NS = 5_000_000_000  # a fault undone this shortly before a stall may still cause it


@dataclass
class Applied:
    """A fault as carried out: wall-clock ns of its start and of its undoing."""

    fault: Fault
    start_ns: int = 0
    end_ns: int = 0


@dataclass
class ChaosRun:
    """One run; `run()` returns the check's stats (it raises, naming the seed, if unclean)."""

    cluster: ComposeCluster
    load: HaLoad
    faults: list[Fault]
    seconds: float
    seed: int
    say: Callable[[str], None] = print
    applied: list[Applied] = field(default_factory=list)
    started_ns: int = 0
    ended_ns: int = 0
    replaced: int = 0  # consumers replaced
    disks: Mapping[str, Disk] = field(default_factory=dict)  # what `fill` faults fill

    async def run(self, report: Path) -> dict[str, Any]:
        self.started_ns = time.time_ns()
        loading = asyncio.create_task(self._load())
        try:
            await self._nemesis()
            await self._heal()
        finally:
            loading.cancel()
            await asyncio.gather(loading, return_exceptions=True)
        self.ended_ns = time.time_ns()
        await self._workers()
        try:
            await self.load.drained()
            # A message a consumer received but may not have acked counts as drained; if its
            # ack was lost it is back in a queue: wait until no process holds any.
            await waiting.until("every queue empty", self._empty, DRAIN_S, every=0.5)
        except AssertionError as err:  # what the nodes hold says where the rest waits
            held, waits = await self._holding(), where(self.load)
            raise AssertionError(f"seed {self.seed}: {err}\n{held}\n{waits}") from None
        await self.load.close()
        return await self.load.verdict(report)

    async def _empty(self) -> bool:
        """No serving process holds a message (a passive one answers nothing)."""
        return not any(isinstance(q, dict) and q for q, _ in (await self._held()).values())

    async def _holding(self) -> str:
        """Every process's queues with messages, and the groups that hold some, as it says."""
        lines = []
        for name, (queues, groups) in (await self._held()).items():
            held = f"queues {queues}; groups {groups}" if groups is not None else queues
            lines.append(f"{name}: {held}")
        return "\n".join(lines)

    async def _held(self) -> dict[str, tuple[Any, list[Any] | None]]:
        """Per process: its queues that hold messages and its groups that do, or the error
        code it answered with (and None)."""
        found: dict[str, tuple[Any, list[Any] | None]] = {}
        for name in HA_ALL:
            url = f"127.0.0.1:{self.cluster.ports[name][0]}"
            try:
                async with self.cluster.access.client(url) as client:
                    queues = {q.name: q.depth for q in await client.queues() if q.depth}
                    groups = (await client.cluster_groups(QUEUE)).groups
            except PinmqError as err:
                found[name] = (err.code, None)
                continue
            held = [g for g in groups if g.pending or g.outstanding or not g.bound]
            found[name] = (queues, held)
        return found

    # ---- the faults ------------------------------------------------------------------------

    async def _nemesis(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        undoing: list[tuple[Fault, asyncio.Task[None]]] = []
        for fault in self.faults:
            await asyncio.sleep(max(0.0, start + fault.at_s - loop.time()))
            await asyncio.gather(*(task for f, task in undoing if waits_for(f, fault)))
            applied = Applied(fault, time.time_ns())
            self.applied.append(applied)
            self.say(f"fault {fault.describe()}")
            await asyncio.to_thread(self._do, fault)
            undo = self._undo_later(applied, start + fault.until_s)
            undoing.append((fault, asyncio.create_task(undo)))
        await asyncio.gather(*(task for _, task in undoing))
        await asyncio.sleep(max(0.0, start + self.seconds - loop.time()))

    async def _undo_later(self, applied: Applied, at: float) -> None:
        await asyncio.sleep(max(0.0, at - asyncio.get_running_loop().time()))
        await asyncio.to_thread(self._undo, applied.fault)
        applied.end_ns = time.time_ns()

    def _do(self, fault: Fault) -> None:
        c = self.cluster
        if fault.kind == "fill":
            self.disks[fault.targets[0]].fill()
            return
        if fault.kind == "stack":
            c.compose("stop", "-t", "30", timeout=180)
        for target in fault.targets:
            if fault.kind == "disconnect":
                c.disconnect(target)
            else:
                c.docker(fault.kind, service=target)

    def _undo(self, fault: Fault) -> None:
        c = self.cluster
        if fault.kind == "fill":
            self.disks[fault.targets[0]].free()
            return
        if fault.kind == "stack":
            c.compose("start", timeout=180)
        for target in fault.targets:
            if fault.kind == "kill":
                c.docker("start", service=target)
            elif fault.kind == "pause":
                c.docker("unpause", service=target)
            else:
                c.connect(target)

    async def _heal(self) -> None:
        """Until every container runs and node3 hears every pair in sync."""
        deadline = asyncio.get_running_loop().time() + SETTLE_S
        while not await self._settled():
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"seed {self.seed}: the cluster did not settle\n{self.plan()}")
            await asyncio.sleep(1.0)

    async def _settled(self) -> bool:
        running = await asyncio.to_thread(self.cluster.compose, "ps", "--format", "{{.Service}}")
        if set(running.split()) != set(HA_ALL):
            return False
        try:
            async with self.cluster.access.client(self.cluster.client_url("node3")) as client:
                pairs = (await client.cluster_status()).ha
        except PinmqError:
            return False
        return len(pairs) == 3 and all(p.backup_in_sync for p in pairs)

    # ---- the load --------------------------------------------------------------------------

    async def _load(self) -> None:
        """Every Python group on its own, and the STOMP groups together, send round after
        round until cancelled: a group whose node is away holds up no other, so a stall is a
        group that could not go on. A round that fails is counted and the next begins (what
        a node confirmed counts)."""
        lanes = [self._lane(python=(g,), stomp=False) for g in PY_GROUPS]
        await asyncio.gather(*lanes, self._lane(python=(), stomp=True), self._supervise())

    async def _lane(self, python: tuple[int, ...], stomp: bool) -> None:
        n = 0
        while True:
            turns = range(n * TURNS, (n + 1) * TURNS)
            n += 1
            remote = ("node2", "node3")[n % 2]
            try:
                await self.load.send(turns, PAUSE_S, remote, python=python, stomp=stomp)
            except PinmqError as err:
                self.load.failures.append(f"{python or 'stomp'} round {n}: {err}")

    async def _supervise(self) -> None:
        while True:
            await self._workers()
            await asyncio.sleep(1.0)

    async def _workers(self) -> None:
        """A consumer whose client gave up (a pair away for longer than its failover allows)
        is replaced by a new one on the same addresses."""
        for worker in list(self.load.workers):
            if worker.task is not None and worker.task.done() and not worker.replaced:
                worker.replaced = True  # kept: what it acked counts
                self.replaced += 1
                name = f"{worker.name.partition('+')[0]}+{self.replaced}"
                await self.load.add_worker(name, self.load.urls[worker.name])

    # ---- what it shows ---------------------------------------------------------------------

    def plan(self) -> str:
        lines = [f"seed {self.seed}, {self.seconds:.0f} s, {len(self.faults)} faults:"]
        lines += [f"  {f.describe()}" for f in self.faults]
        return "\n".join(lines)

    def availability(self, stats: dict[str, Any]) -> list[dict[str, Any]]:
        """Per group: its longest stall, the share of the run it was served, and the faults
        that held during that stall."""
        run_ms = (self.ended_ns - self.started_ns) / 1e6
        per_group = stats["stalls"]["per_group"]
        rows = []
        for key in self.load.group_keys():
            g = per_group.get(key)
            if g is None:
                rows.append({"group": key, "longest_stall_ms": 0, "served": 1.0, "faults": []})
                continue
            held = [
                a.fault.describe().strip()
                for a in self.applied
                if a.start_ns <= g["longest_to_ns"]
                and (a.end_ns or self.ended_ns) + CAUSE_SLACK_NS >= g["longest_from_ns"]
            ]
            served = max(0.0, 1 - g["stalled_ms"] / run_ms)
            row = {"group": key, "longest_stall_ms": g["longest_ms"], "served": served}
            rows.append({**row, "faults": held})
        return rows
