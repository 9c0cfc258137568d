"""Fault drills on a real three-node cluster, judged by `pinmq check` on the audit history.

The drills: a REMOTE node killed while it holds unacked messages and kept away past 3x the
handler timeout, a REMOTE node frozen for 10 s, the LOCAL node killed, and the whole cluster
killed, each under load and each restarted.

Every node audits, and so do the clients (sends, receipts, acks), so the checker sees each
message from producer to ack. A drill passes when the checker finds no loss, no duplicate,
no order and no exclusivity violation, with the shipped grouping defaults. The checker runs
as the `pinmq check` command, so Spark starts in a process of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_nodes import NODES, ClusterNodes, create_everywhere, grouping
from conftest import unique
from drill_parts import HOLD, Worker, clean_check

from broker.audit import read_events
from broker.client import Client, PinmqError, Producer

pytestmark = pytest.mark.slow  # each drill ends with a Spark check: a minute or more

TIMEOUT_MS = 500  # the grouping handler's decision timeout
LEASE_MS = 1500  # a REMOTE node's lease, with rebind-absent-after
GROUPS = 24
PER_GROUP = 30  # messages per group: half before the kill, half while the node is away
WAIT_S = 60.0


@pytest.fixture
def drill(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Drill]:
    """The cluster (grouping settings from a `grouping` marker, else the shipped defaults)."""
    audit = {"audit": {"enabled": True, "flush-ms": 20}}
    marker = request.node.get_closest_marker("grouping")
    settings = marker.kwargs if marker is not None else {}
    spec = grouping(NODES, timeout=TIMEOUT_MS, extra=audit, **settings)
    separable = request.node.get_closest_marker("separable")
    (tmp_path / "nodes").mkdir()
    nodes = ClusterNodes(tmp_path / "nodes", spec, separable.args[0] if separable else None)
    try:
        nodes.start()
        yield Drill(nodes, tmp_path / "history")
    finally:
        nodes.kill_all()


class Drill:
    """A queue on every node, audited clients, workers that ack as they go, and the verdict."""

    def __init__(self, nodes: ClusterNodes, history: Path) -> None:
        self.nodes, self.history = nodes, history
        self.clients_dir = history / "clients"
        self.queue = unique("drill")
        self.drain = asyncio.Event()
        self.workers: dict[str, Worker] = {}
        self.clients: list[Client] = []
        self.confirmed: set[bytes] = set()  # bodies whose send the node confirmed
        self.producers: dict[int, tuple[Client, Producer]] = {}  # group -> sender, with `keep`

    async def start(self) -> None:
        await create_everywhere(self.nodes, self.queue)
        for node_id in NODES:
            await self.start_worker(node_id, f"worker-{node_id}")
        await asyncio.to_thread(self.nodes.wait_consumers, self.queue, {n: 1 for n in NODES})

    async def start_worker(self, node_id: str, name: str) -> Worker:
        client = Client(self.nodes.url(node_id), audit=self.clients_dir)
        await client.connect()
        self.clients.append(client)
        worker = self.workers[name] = Worker(name)
        worker.task = asyncio.create_task(worker.run(client, self.queue, self.drain))
        return worker

    async def holding(self, node_id: str) -> Worker:
        """Its worker, once it holds HOLD unacked deliveries."""
        worker = self.workers[f"worker-{node_id}"]
        async with asyncio.timeout(WAIT_S):
            while len(worker.held) < HOLD:
                await asyncio.sleep(0.02)
        return worker

    async def kill_holding(self, node_id: str) -> int:
        """Kill a node (-9) once its worker holds HOLD unacked deliveries (its stream ends);
        when it was killed (ns)."""
        worker = await self.holding(node_id)
        killed = time.time_ns()
        self.nodes.stop(node_id, signal.SIGKILL)
        with pytest.raises(PinmqError):
            await worker.task  # type: ignore[misc]
        return killed

    async def send(
        self, turns: range, via: tuple[str, ...] = ("n1", "n2"), keep: bool = False
    ) -> None:
        """Every group's messages of `turns`, the groups concurrently, through the nodes of
        `via` in turn. A send that fails is left out (what the node confirmed counts).

        `keep`: each group's producer (and its client) stays for the next `keep` send, so one
        producer's sequence spans the calls (the checker compares order per producer)."""

        async def group(g: int) -> None:
            node_id = via[g % len(via)]
            bodies = [f"g{g:02d}-{i}".encode() for i in turns]
            done = 0

            def sent(n: int) -> None:
                nonlocal done
                self.confirmed.update(bodies[done : done + n])
                done += n

            kept = self.producers.get(g)
            if kept is None:
                sender = Client(self.nodes.url(node_id), audit=self.clients_dir)
                await sender.connect()
                kept = (sender, sender.producer(self.queue, group_id=f"g{g:02d}"))
                if keep:
                    self.producers[g] = kept
                    self.clients.append(sender)  # closed with the drill
            sender, producer = kept
            try:
                with contextlib.suppress(PinmqError):
                    await producer.send_many(bodies, batch_size=5, on_sent=sent)
            finally:
                if not keep:
                    await sender.close()

        await asyncio.gather(*(group(g) for g in range(GROUPS)))

    async def unbound_from(self, node_id: str) -> None:
        """Until the LOCAL arbiter (n1) binds no group of the queue to `node_id`."""
        async with self.nodes.client("n1") as client, asyncio.timeout(WAIT_S):
            while any(
                g.bound and g.node == node_id
                for g in (await client.cluster_groups(self.queue)).groups
            ):
                await asyncio.sleep(0.05)

    async def all_acked(self) -> None:
        """Until every confirmed message is acked; else fail with what the nodes still hold."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while not self.confirmed <= set().union(
            *(w.acked | w.unsure for w in self.workers.values())
        ):
            if loop.time() > deadline:
                depths = {}
                for node_id in NODES:
                    async with self.nodes.client(node_id) as client:
                        listed = await client.queues()
                        depths[node_id] = {q.name: q.depth for q in listed if q.depth}
                acked = {w.name: len(w.acked) for w in self.workers.values()}
                pytest.fail(f"not all {len(self.confirmed)} acked: {acked}; depths {depths}")
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        self.drain.set()
        tasks = [w.task for w in self.workers.values() if w.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for client in self.clients:
            await client.close()

    async def verdict(self, report: Path) -> dict[str, Any]:
        """Stop every node cleanly, gather the audit logs, require a clean check; its stats."""
        for node_id in NODES:
            self.nodes.stop(node_id)  # clean stop: every node writes its audit tail
        for node_id in NODES:
            audit = self.nodes.nodes[node_id].data_dir / "audit"
            shutil.copytree(audit, self.history / node_id)
        return await clean_check(self.history, report)


async def test_a_remote_node_killed_with_messages_out_comes_back_without_breaking_a_group(
    drill: Drill, tmp_path: Path
) -> None:
    nodes = drill.nodes
    await drill.start()
    try:
        await drill.send(range(PER_GROUP // 2))
        killed = await drill.kill_holding("n3")  # n3 holds deliveries it never acks
        # The senders go on while n3 is away, before and after 3x the handler timeout: n3's
        # groups wait for it, in order, in the senders' store-and-forward queues.
        await drill.send(range(PER_GROUP // 2, PER_GROUP * 2 // 3))
        await asyncio.sleep(3 * TIMEOUT_MS / 1000)
        await drill.send(range(PER_GROUP * 2 // 3, PER_GROUP))
        assert len(drill.confirmed) == GROUPS * PER_GROUP  # n1 and n2 took every send
        away_ms = (time.time_ns() - killed) / 1e6
        nodes.start("n3")
        await drill.start_worker("n3", "worker-n3-again")
        drill.drain.set()
        await drill.all_acked()
    finally:
        await drill.close()
    stats = await drill.verdict(tmp_path / "report")
    # The report explains it: n3's run ended and a later one began, and n3's groups stalled
    # across it at least as long as n3 was known to be away.
    [failover] = [g for g in stats["failovers"] if g["what"].startswith("node n3 stopped (back")]
    assert failover["groups_stalled"] >= 1
    assert failover["group_gap_ms"] >= away_ms, (failover, away_ms)
    assert stats["stalls"]["longest"][0]["gap_ms"] >= away_ms


@pytest.mark.grouping(rebind_absent_after=TIMEOUT_MS)
async def test_with_rebind_absent_after_a_returning_node_moves_its_groups_to_their_new_binding(
    drill: Drill, tmp_path: Path
) -> None:
    """The opt-in trade: n3's groups are bound elsewhere while it is away and flow there; when
    n3 returns, what it held of them (and what waited for it in store-and-forward) follows
    them, audited as `moved`. Order changes are accepted; nothing is lost or doubled, and no
    group is ever at two consumers."""
    nodes = drill.nodes
    await drill.start()
    try:
        await drill.send(range(PER_GROUP // 3), keep=True)
        await drill.kill_holding("n3")
        await drill.send(range(PER_GROUP // 3, PER_GROUP // 2), keep=True)  # wait for n3, in SF
        await drill.unbound_from("n3")  # the arbiter took n3's bindings away: it was absent
        await drill.send(range(PER_GROUP // 2, PER_GROUP), keep=True)  # bound on n1 / n2 now
        assert len(drill.confirmed) == GROUPS * PER_GROUP
        nodes.start("n3")
        await drill.start_worker("n3", "worker-n3-again")
        drill.drain.set()
        await drill.all_acked()
    finally:
        await drill.close()
    back = drill.workers["worker-n3-again"]
    stats = await drill.verdict(tmp_path / "report")
    moved = stats["moved"]
    # What n3 held when killed (its consumer's unacked messages at least) moved, each with
    # its delivery count, and the order changes that made are counted as accepted.
    assert moved["messages"] >= HOLD and moved["groups"] >= 1, moved
    assert moved["delivered_before"] >= HOLD, moved
    assert moved["order_changes_accepted"] >= 1, moved
    assert stats["events"]["moved"] == moved["messages"]
    removed = [c for c in stats["binding_changes"] if c["kind"] == "unbound"]
    assert [(c["target"].rpartition("@")[2], c["reason"]) for c in removed] == [
        ("n3", "instance-absent")
    ], removed
    # A moved message that had been delivered on n3 is a redelivery where it arrives.
    events: dict[str, list[dict[str, Any]]] = {}
    for segment in sorted(drill.history.glob("n*/*.jsonl")):
        for e in read_events(segment):
            if e.get("mid") and e.get("queue") == drill.queue:
                events.setdefault(e["mid"], []).append(e)
    redelivered = 0
    for found in events.values():
        found.sort(key=lambda e: (e["ts_ns"], e["n"]))
        kinds = [e["kind"] for e in found]
        if "moved" in kinds and found[kinds.index("moved")].get("delivery_count", 0) > 0:
            after = [e for e in found[kinds.index("moved") :] if e["kind"] == "delivered"]
            assert after and after[0]["delivery_count"] >= 2, found
            redelivered += 1
    assert redelivered == moved["delivered_before"]
    # Every group n3 had is bound on n1 or n2 by the time it returns: its new consumer gets
    # nothing, although n3 held messages of those groups.
    assert not back.acked and not back.held
    report = (tmp_path / "report" / "report.html").read_text()
    assert "moved" in report and "instance-absent" in report


@pytest.mark.grouping(rebind_absent_after=TIMEOUT_MS, lease=LEASE_MS, lease_margin=LEASE_MS // 3)
@pytest.mark.separable("n3")
async def test_with_rebind_absent_after_a_node_cut_off_alive_delivers_nothing_bound_elsewhere(
    drill: Drill, tmp_path: Path
) -> None:
    """The opt-in trade under a partition: n3 is cut off from n1 and n2 while it and its
    consumers go on. Its lease from the arbiter (n1) lapses, so it takes back what its consumer
    held and holds its groups; only after that lease has certainly run out does n1 bind them
    elsewhere. n3 delivers nothing more of them, although a consumer of it is subscribed
    throughout; once joined again, what it held follows the groups, audited as `moved`."""
    nodes = drill.nodes
    await drill.start()
    try:
        await drill.send(range(PER_GROUP // 3), keep=True)
        first = await drill.holding("n3")
        nodes.cut_off()
        async with asyncio.timeout(WAIT_S):
            with pytest.raises(PinmqError):  # n3 ended its stream: those deliveries are void
                await first.task  # type: ignore[misc]
        cut = await drill.start_worker("n3", "worker-n3-cut")  # n3 still serves its clients
        await drill.send(range(PER_GROUP // 3, PER_GROUP // 2), keep=True)  # wait for n3
        await drill.unbound_from("n3")  # the arbiter took n3's bindings away while it is alive
        await drill.send(range(PER_GROUP // 2, PER_GROUP), keep=True)  # bound on n1 / n2 now
        assert len(drill.confirmed) == GROUPS * PER_GROUP
        nodes.cut_off(False)
        await asyncio.to_thread(nodes.wait_linked)
        drill.drain.set()
        await drill.all_acked()
    finally:
        await drill.close()
    stats = await drill.verdict(tmp_path / "report")
    # n3's consumer got nothing while cut off, nor after: every group it had moved on.
    assert not cut.acked and not cut.held
    moved = stats["moved"]
    assert moved["messages"] >= HOLD and moved["delivered_before"] >= HOLD, moved
    removed = [c for c in stats["binding_changes"] if c["kind"] == "unbound"]
    assert {(c["target"].rpartition("@")[2], c["reason"]) for c in removed} == {
        ("n3", "instance-absent")
    }, removed
    log = nodes.nodes["n3"].log()
    assert "grouping lease lapsed" in log and "grouping lease held again" in log


async def test_a_remote_node_frozen_for_10_s_under_load_breaks_no_group(
    drill: Drill, tmp_path: Path
) -> None:
    nodes = drill.nodes
    await drill.start()
    frozen = nodes.nodes["n2"].proc
    assert frozen is not None
    try:
        await drill.send(range(10))
        os.kill(frozen.pid, signal.SIGSTOP)
        froze = time.time_ns()
        thaw_at = asyncio.get_running_loop().time() + 10
        try:
            # Sends through n2 fail once keepalive gives up on it (outcome unknown); those
            # through n1 for n2's groups wait in n1's store-and-forward queue.
            await drill.send(range(10, 20))
        finally:
            await asyncio.sleep(max(0.0, thaw_at - asyncio.get_running_loop().time()))
            os.kill(frozen.pid, signal.SIGCONT)
        frozen_ms = (time.time_ns() - froze) / 1e6
        n2 = drill.workers["worker-n2"]
        with pytest.raises(PinmqError):  # its stream went with the keepalive
            await n2.task  # type: ignore[misc]
        await asyncio.to_thread(nodes.wait_linked)
        await drill.start_worker("n2", "worker-n2-again")
        await drill.send(range(20, PER_GROUP))
        drill.drain.set()
        await drill.all_acked()
    finally:
        await drill.close()
    stats = await drill.verdict(tmp_path / "report")
    # A frozen node ends no run: the group stalls are what shows the freeze in the report.
    assert not [g for g in stats["failovers"] if g["what"].startswith("node n2")]
    longest = stats["stalls"]["longest"][0]
    assert longest["gap_ms"] >= frozen_ms, (longest, frozen_ms)


async def test_the_local_node_killed_and_restarted_under_load_breaks_no_group(
    drill: Drill, tmp_path: Path
) -> None:
    nodes = drill.nodes
    await drill.start()
    try:
        await drill.send(range(10), via=("n2", "n3"))
        await drill.kill_holding("n1")
        # Bound groups flow without the arbiter: REMOTE nodes route them from their caches.
        await drill.send(range(10, 20), via=("n2", "n3"))
        assert len(drill.confirmed) == GROUPS * 20
        nodes.start("n1")
        await drill.start_worker("n1", "worker-n1-again")
        await drill.send(range(20, PER_GROUP), via=("n1", "n2", "n3"))
        drill.drain.set()
        await drill.all_acked()
    finally:
        await drill.close()
    await drill.verdict(tmp_path / "report")


async def test_the_whole_cluster_killed_and_restarted_under_load_breaks_no_group(
    drill: Drill, tmp_path: Path
) -> None:
    nodes = drill.nodes
    await drill.start()
    try:
        await drill.send(range(15))
        async with asyncio.timeout(WAIT_S):
            while any(len(w.held) < HOLD for w in drill.workers.values()):
                await asyncio.sleep(0.02)
        for node_id in NODES:
            nodes.stop(node_id, signal.SIGKILL)
        for name in list(drill.workers):
            with pytest.raises(PinmqError):
                await drill.workers[name].task  # type: ignore[misc]
        nodes.start()
        for node_id in NODES:
            await drill.start_worker(node_id, f"worker-{node_id}-again")
        await drill.send(range(15, PER_GROUP))
        drill.drain.set()
        await drill.all_acked()
    finally:
        await drill.close()
    await drill.verdict(tmp_path / "report")
