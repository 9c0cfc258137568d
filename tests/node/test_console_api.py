"""The web console's page and JSON (`pinmq/console.py`) from real node processes: the figures
move with real traffic, and a group is found where its consumer is, with its owner."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_nodes import ClusterNodes, grouping
from conftest import get, unique
from waiting import until


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[ClusterNodes]:
    nodes = ClusterNodes(tmp_path, grouping(["n1", "n2"]))
    yield nodes.start()
    nodes.kill_all()


def counts(http: str, queue: str) -> dict[str, Any] | None:
    """The queue's row of /api/queues, None while the node has no such queue."""
    _, body = get(http, "/api/queues")
    return next((q for q in body["queues"] if q["name"] == queue), None)


def test_the_page_and_its_files_are_served_with_a_policy_of_their_own(pair: ClusterNodes) -> None:
    http = pair.nodes["n1"].http
    with urllib.request.urlopen(f"http://{http}/", timeout=5) as page:
        assert page.headers.get_content_type() == "text/html"
        assert "script-src 'self'" in page.headers["Content-Security-Policy"]
        assert b'src="/console/console.js"' in page.read()
    with urllib.request.urlopen(f"http://{http}/console/console.js", timeout=5) as script:
        assert script.headers.get_content_type() == "text/javascript"
    status, body = get(http, "/api/groups")
    assert status == 400 and body == {"error": "group: a group name is required"}


async def test_queues_groups_and_lagging_follow_real_traffic(pair: ClusterNodes) -> None:
    n1, n2 = pair.nodes["n1"].http, pair.nodes["n2"].http
    status, cluster = get(n1, "/api/cluster")
    assert status == 200 and cluster["node"] == "n1" and cluster["ready"] is True
    assert [(n["node_id"], n["local"], n["handler"], n["connected"]) for n in cluster["nodes"]] == [
        ("n1", True, "LOCAL", True),
        ("n2", False, "REMOTE", True),
    ]
    assert cluster["ha"] == [] and cluster["problems"] == []

    queue, group = unique("console"), unique("g")
    async with pair.client("n2") as at_n2:
        await at_n2.create_queue(queue)
        async with at_n2.consumer(queue, name="worker", prefetch=1) as consumer:
            pair.wait_consumers(queue, {"n2": 1})
            async with pair.client("n1") as at_n1:
                await at_n1.producer(queue, group_id=group).send_many(["a", "b", "c"])
            first = await consumer.receive(timeout=30)
            assert first is not None
            await until("all three on n2", lambda: (counts(n2, queue) or {}).get("enqueued") == 3)
            expected = {
                **{"name": queue, "address": queue, "pending": 2, "in_flight": 1, "paged": 0},
                **{"consumers": 1, "groups": 1, "owned": 1, "held": 0},
                **{"enqueued": 3, "settled": 0},
            }
            row = counts(n2, queue) or {}
            assert {k: row[k] for k in expected} == expected
            assert 0 < row["in_flight_bytes"] < row["memory_bytes"]
            # Asked on n1, the group is where its consumer is: bound to n2 and owned there.
            _, found = get(n1, f"/api/groups?group={group}")
            [row] = found["groups"]
            assert (row["queue"], row["node"], row["bound"]) == (queue, "n2", True)
            assert (row["owner_name"], row["pending"], row["outstanding"]) == ("worker", 2, 1)
            assert 0 < row["oldest_pending_ms"] <= found["now_ms"] and found["unreachable"] == []

            def lagging() -> dict[str, Any]:
                _, body = get(n2, "/api/lagging")
                return body if body["groups"] else {}

            lag = await until("n2's lagging groups list the group", lagging, off_loop=True)
            assert [(g["group"], g["queue"], g["pending"]) for g in lag["groups"]] == [
                (group, queue, 2)
            ]
            assert [(c["name"], c["unacked"]) for c in lag["consumers"]] == [("worker", 1)]
            await first.ack(wait=True)
            for _ in range(2):
                m = await consumer.receive(timeout=30)
                assert m is not None
                await m.ack(wait=True)
            assert counts(n2, queue)["settled"] == 3  # type: ignore[index]
