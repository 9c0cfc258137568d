"""A clean SIGTERM shutdown of a busy cluster logs that each node stopped, and nothing worse.

`make down` sends SIGTERM to every node at once. Each must exit 0 and write only JSON lines
below warning level from then on (a traceback or a stray library error is a line that is not
JSON, or one at warning level or above), ending with "node stopped". The race that left
"Task exception was never retrieved" in the logs depends on which link ends first, so the
same busy cluster is stopped several times.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest
from cluster_nodes import ClusterNodes, Collector, grouping, stomp_send
from conftest import unique

from broker.client import Client

NODES = ("n1", "n2", "n3")
ROUNDS = 5


def shutdown_lines(log: str) -> list[str]:
    """The lines a node wrote from its "node stopping" on (its last shutdown)."""
    lines = log.splitlines()
    start = max(i for i, line in enumerate(lines) if '"node stopping"' in line)
    return lines[start:]


def not_clean(lines: list[str]) -> list[str]:
    """Lines that are not JSON, or are at warning level or above."""
    bad = []
    for line in lines:
        try:
            level = json.loads(line).get("level")
        except ValueError:
            bad.append(line)
            continue
        if level not in ("debug", "info"):
            bad.append(line)
    return bad


async def busy(nodes: ClusterNodes, queue: str) -> tuple[Collector, list[Client]]:
    """Every cluster path in use: a consumer on n3, a group sent through n1, n2 and STOMP."""
    collector, clients = Collector(), []
    for node_id in NODES:
        async with nodes.client(node_id) as client:
            await client.create_queue(queue)
    consumer = nodes.client("n3")
    await consumer.connect()
    clients.append(consumer)
    await collector.add(consumer, queue, "n3")
    nodes.wait_consumers(queue, {"n3": 1})
    group = unique("g")
    for via in ("n1", "n2"):
        async with nodes.client(via) as client:
            await client.producer(queue, group_id=group).send_batch(
                [f"{via}-{i}" for i in range(5)]
            )
    await stomp_send(nodes.stomp_port("n2"), queue, [("stomp", {"JMSXGroupID": group})])
    await collector.wait(11, "before the shutdown")
    return collector, clients


@pytest.mark.slow
async def test_sigterm_to_every_node_of_a_busy_cluster_stops_each_cleanly(tmp_path: Path) -> None:
    nodes = ClusterNodes(tmp_path, grouping(NODES))
    try:
        for round_ in range(ROUNDS):
            nodes.start()
            collector, clients = await busy(nodes, unique(f"round{round_}"))
            try:
                for node in nodes.nodes.values():  # all at once, as `pinmq down` does
                    assert node.proc is not None
                    node.proc.send_signal(signal.SIGTERM)
                codes = {n: node.wait_exit() for n, node in nodes.nodes.items()}
            finally:
                await collector.close()
                for client in clients:
                    await client.close()
            assert codes == dict.fromkeys(NODES, 0)
            for node_id, node in nodes.nodes.items():
                lines = shutdown_lines(node.log())
                assert not_clean(lines) == [], f"round {round_}, {node_id}:\n" + "\n".join(lines)
                assert '"node stopped"' in lines[-1], f"{node_id} ended with {lines[-1]}"
    finally:
        nodes.kill_all()


async def test_a_stop_step_that_hangs_is_abandoned_so_the_node_still_exits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pinmq import node as node_module

    monkeypatch.setattr(node_module, "STEP_LIMIT_S", 0.2)
    never = asyncio.get_running_loop().create_future()
    hanging = asyncio.ensure_future(never)

    async def hangs() -> None:
        await hanging

    async with asyncio.timeout(5):
        await node_module._bounded("a peer's channel", hangs())
    await asyncio.sleep(0)
    assert hanging.cancelled()  # what it waited on was let go
