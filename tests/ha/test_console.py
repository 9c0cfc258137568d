"""The web console in a real headless Chromium, against the ha drills' cluster of real
processes: the page on node2 (REMOTE, it outlives the primary) shows the nodes and the pair,
finds a group sent a moment before with its owner, shows the backup active at a higher epoch
after kill -9 of the primary, logs no JavaScript error, and says when its node stopped
answering. The screenshot stays in the test's temporary directory."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import Browser
from conftest import get, unique
from ha_nodes import BACKUP, PRIMARY, HaCluster
from waiting import until

from broker.client import Client


@pytest.fixture
def ha(tmp_path: Path) -> Iterator[HaCluster]:
    cluster = HaCluster(tmp_path).start()  # node1 serves, its backup in sync
    yield cluster
    cluster.kill_all()


def consumers_seen(http: str, node: str, queue: str) -> bool:
    """The console at `http` lists `node` with a consumer of `queue`."""
    _, body = get(http, "/api/cluster")
    return any(n["node_id"] == node and n["consumers"].get(queue) for n in body["nodes"])


async def test_the_console_shows_the_cluster_a_group_and_a_failover(
    ha: HaCluster, browser: Browser, tmp_path: Path
) -> None:
    node2, node3 = ha.nodes["node2"], ha.nodes["node3"]
    queue, group = unique("console"), unique("group")
    await asyncio.to_thread(browser.open, f"http://{node2.http}/")

    def pair() -> list[str] | None:
        """The pair's row: node, active process, epoch, backup, in sync, as told by."""
        rows = browser.rows("#pairs")
        return rows[0] if rows and rows[0][0] == PRIMARY else None

    row = await until("the page shows the pair", pair, off_loop=True)
    assert row[1] == PRIMARY and row[3:5] == [BACKUP, "yes"]
    epoch = int(row[2])
    nodes = {r[0]: r for r in browser.rows("#nodes")}
    assert set(nodes) == {PRIMARY, "node2", "node3"}
    assert nodes["node2"][1:3] == ["REMOTE", "this node"]
    assert nodes[PRIMARY][1:3] == ["LOCAL", "linked"]

    # A consumer on node3 (prefetch 1) holds the group's first message; two wait there.
    async with Client(node3.url) as at_node3:
        await at_node3.create_queue(queue)
        async with at_node3.consumer(queue, name="console-worker", prefetch=1) as consumer:
            await consumer.start()
            await until(
                "node2 sees the consumer on node3",
                lambda: consumers_seen(node2.http, "node3", queue),
                off_loop=True,
            )
            async with Client(node2.url) as at_node2:
                await at_node2.producer(queue, group_id=group).send_many(["a", "b", "c"])
            assert await consumer.receive(timeout=30) is not None
            await asyncio.to_thread(browser.search, group)

            def found() -> list[str] | None:
                rows = [r for r in browser.rows("#group-table") if r[:1] == [group]]
                return rows[0] if rows and rows[0][4] == "2" else None

            row = await until("the search finds the group", found, off_loop=True)
            assert row[1:3] == [f"{queue}@node3", "yes"]
            assert row[3].startswith("console-worker (") and row[6] == "1"
            assert row[5].endswith(" s ago")  # the age of its oldest waiting message

            ha.primary.stop(signal.SIGKILL)

            def took_over() -> bool:
                row = pair()
                return row is not None and row[1] == BACKUP and int(row[2]) > epoch

            await until("the page shows the backup active", took_over, 60, off_loop=True)
            await asyncio.to_thread(browser.screenshot, tmp_path / "console.png")
            assert await asyncio.to_thread(browser.errors) == []

    node2.kill()
    banner = await until(
        "the page says node2 stopped answering", lambda: browser.text("#banner"), off_loop=True
    )
    assert banner.startswith("node node2 stopped answering since ")
