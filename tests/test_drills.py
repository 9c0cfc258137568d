"""Fault drills on a real three-node cluster, judged by `pinmq check` on the audit history.

Every node audits, and so do the clients (sends, receipts, acks), so the checker sees each
message from producer to ack. A drill passes when the checker finds no loss, no duplicate,
no order and no exclusivity violation, with the shipped grouping defaults. The checker runs
as the `pinmq check` command, so Spark starts in a process of its own.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cluster_nodes import NODES, ClusterNodes, create_everywhere, grouping
from conftest import PINMQ, unique

from broker.client import Client, PinmqError, Received

TIMEOUT_MS = 500  # the grouping handler's decision timeout
GROUPS = 24
PER_GROUP = 30  # messages per group: half before the kill, half while the node is away
HOLD = 8  # each consumer keeps its newest deliveries unacked, so a kill finds some out
WAIT_S = 60.0


@pytest.fixture
def drilled(tmp_path: Path) -> Iterator[tuple[ClusterNodes, Path]]:
    audit = {"audit": {"enabled": True, "flush-ms": 20}}
    spec = grouping(NODES, timeout=TIMEOUT_MS, extra=audit)
    (tmp_path / "nodes").mkdir()
    nodes = ClusterNodes(tmp_path / "nodes", spec)
    try:
        nodes.start()
        yield nodes, tmp_path / "history"
    finally:
        nodes.kill_all()


@dataclass
class Worker:
    """One consumer on one node that acks all but its newest HOLD deliveries as it goes."""

    name: str
    acked: set[bytes] = field(default_factory=set)  # bodies: msg ids are per node
    held: list[Received] = field(default_factory=list)
    unsure: set[bytes] = field(default_factory=set)  # acks in flight when the node died
    task: asyncio.Task[None] | None = None

    async def run(self, client: Client, queue: str, drain: asyncio.Event) -> None:
        async with client.consumer(queue, name=self.name, prefetch=HOLD + 4) as consumer:
            while True:
                m = await consumer.receive(timeout=0.2)
                if m is not None:
                    self.held.append(m)
                if len(self.held) > HOLD or (drain.is_set() and self.held):
                    oldest = self.held.pop(0)
                    try:
                        await oldest.ack(wait=True)
                    except PinmqError:
                        self.unsure.add(oldest.body)  # committed or not: redelivered if not
                        raise
                    self.acked.add(oldest.body)


async def check(history: Path, report: Path) -> tuple[dict[str, int], str]:
    """`pinmq check` on the history, as a user runs it: its violation counts and its output."""
    done = await asyncio.to_thread(
        subprocess.run,
        [*PINMQ, "check", str(history), "--master", "local[2]", "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stderr
    summary = json.loads((report / "summary.json").read_text())
    return summary["violations"], done.stdout


async def all_acked(
    nodes: ClusterNodes, queue: str, workers: dict[str, Worker], total: int
) -> None:
    """Until `total` distinct messages are acked; else fail with what each node still holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while len(set().union(*(w.acked | w.unsure for w in workers.values()))) < total:
        if loop.time() > deadline:
            depths = {}
            for node_id in NODES:
                async with nodes.client(node_id) as client:
                    depths[node_id] = {q.name: q.depth for q in await client.queues() if q.depth}
            acked = {w.name: len(w.acked) for w in workers.values()}
            pytest.fail(f"not all {total} acked: {acked}; depths {depths}")
        await asyncio.sleep(0.05)


async def test_a_remote_node_killed_with_messages_out_comes_back_without_breaking_a_group(
    drilled: tuple[ClusterNodes, Path], tmp_path: Path
) -> None:
    nodes, history = drilled
    clients_dir = history / "clients"
    queue = unique("drill")
    await create_everywhere(nodes, queue)
    drain = asyncio.Event()
    workers: dict[str, Worker] = {}
    clients: list[Client] = []

    async def start_worker(node_id: str, name: str) -> Worker:
        client = Client(nodes.url(node_id), audit=clients_dir)
        await client.connect()
        clients.append(client)
        worker = workers[name] = Worker(name)
        worker.task = asyncio.create_task(worker.run(client, queue, drain))
        return worker

    for node_id in NODES:
        await start_worker(node_id, f"worker-{node_id}")
    await asyncio.to_thread(nodes.wait_consumers, queue, {n: 1 for n in NODES})

    async def send(turns: range) -> None:
        # Each group's messages enter through n1 and n2 in turn; JMSXGroupSeq counts on.
        for g in range(GROUPS):
            async with Client(nodes.url(f"n{g % 2 + 1}"), audit=clients_dir) as sender:
                producer = sender.producer(queue, group_id=f"g{g:02d}")
                await producer.send_many([f"g{g:02d}-{i}" for i in turns], batch_size=5)

    try:
        await send(range(PER_GROUP // 2))
        n3 = workers["worker-n3"]
        async with asyncio.timeout(WAIT_S):
            while len(n3.held) < HOLD:  # n3 holds deliveries it never acks
                await asyncio.sleep(0.02)
        nodes.stop("n3", signal.SIGKILL)
        with pytest.raises(PinmqError):
            await n3.task  # type: ignore[misc]
        # The senders go on while n3 is away, before and after 3x the handler timeout: n3's
        # groups wait for it, in order, in the senders' store-and-forward queues.
        await send(range(PER_GROUP // 2, PER_GROUP * 2 // 3))
        await asyncio.sleep(3 * TIMEOUT_MS / 1000)
        await send(range(PER_GROUP * 2 // 3, PER_GROUP))
        nodes.start("n3")
        await start_worker("n3", "worker-n3-again")
        drain.set()
        total = GROUPS * PER_GROUP
        await all_acked(nodes, queue, workers, total)
    finally:
        drain.set()
        for w in workers.values():
            if w.task is not None and not w.task.done():
                w.task.cancel()
        await asyncio.gather(*(w.task for w in workers.values() if w.task), return_exceptions=True)
        for client in clients:
            await client.close()
    for node_id in NODES:
        nodes.stop(node_id)  # clean stop: every node writes its audit tail
    for node_id in NODES:
        shutil.copytree(nodes.nodes[node_id].data_dir / "audit", history / node_id)

    counts, output = await check(history, tmp_path / "report")
    assert counts == {k: 0 for k in counts}, output
    assert {"lost", "duplicates", "order", "exclusivity"} <= counts.keys(), counts
    assert "verdict: CLEAN" in output
