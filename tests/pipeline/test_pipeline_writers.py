"""The PySpark checker on what the real writers write: every audit kind from a node's and a
client's writer read back as written, and a real three-node cluster's history under grouped
load through every node checked clean (the synthetic histories: tests/pipeline/test_pipeline.py).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from audit_kinds import read_back_differences, write_every_kind
from cluster_nodes import ClusterNodes, grouping
from conftest import unique

from broker.audit_schema import Kind
from broker.client import Client
from pipeline import job, pure
from pipeline.history import load

pytestmark = pytest.mark.slow  # a Spark session, then seconds a check

NONE = dict.fromkeys(("lost", "duplicates", "order", "exclusivity", "routing"), 0)

# ---- the real writers ---------------------------------------------------------------------


async def test_every_kind_reads_back_as_the_writers_wrote_it(
    spark: Any, url: str, tmp_path: Path
) -> None:
    """Every field of every kind, from a node's and a client's writer: same value, schema type."""
    await write_every_kind(tmp_path, url)
    history = load(spark, tmp_path)
    try:
        assert read_back_differences(history.events.collect(), tmp_path) == []
        assert set(history.kinds) == set(Kind) and not history.unknown_kinds
        # compact JSON of known keys only: every file adds up, none is read twice
        assert (history.malformed, history.rechecked, history.unknown_keys) == (0, 0, {})
    finally:
        history.table.unpersist()


@pytest.fixture
def audited_cluster(tmp_path: Path) -> Iterator[tuple[ClusterNodes, Path]]:
    history = tmp_path / "history"
    (tmp_path / "nodes").mkdir()
    audit = {"audit": {"enabled": True, "flush-ms": 20}}
    nodes = ClusterNodes(
        tmp_path / "nodes",
        {n: {**spec, **audit} for n, spec in grouping(["n1", "n2", "n3"]).items()},
    )
    try:
        nodes.start()
        yield nodes, history
    finally:
        nodes.kill_all()


async def test_a_real_three_node_cluster_history_is_clean(
    spark: Any, audited_cluster: tuple[ClusterNodes, Path], tmp_path: Path
) -> None:
    nodes, history = audited_cluster
    queue = unique("orders")
    clients_dir = history / "clients"
    for node_id in ("n1", "n2", "n3"):
        async with Client(nodes.url(node_id)) as c:
            await c.create_queue(queue)
    consumers = []
    received: dict[str, int] = {}
    clients = [Client(nodes.url(n), audit=clients_dir) for n in ("n1", "n2", "n3")]
    for c in clients:
        await c.connect()

    async def consume(c: Client, name: str) -> None:
        async with c.consumer(queue, name=name, prefetch=20) as consumer:
            consumers.append(consumer)
            while (m := await consumer.receive(timeout=5.0)) is not None:
                received[name] = received.get(name, 0) + 1
                await m.ack()

    tasks = [asyncio.create_task(consume(c, f"worker-{i}")) for i, c in enumerate(clients)]
    await asyncio.to_thread(nodes.wait_consumers, queue, {"n1": 1, "n2": 1, "n3": 1})
    groups, per_group = 12, 25
    for g in range(groups):  # each group's messages enter through every node in turn
        async with Client(nodes.url(f"n{g % 3 + 1}"), audit=clients_dir) as producer_client:
            producer = producer_client.producer(queue, group_id=f"g{g}")
            await producer.send_many([f"g{g}-{i}" for i in range(per_group)], batch_size=10)
    await asyncio.gather(*tasks)
    for c in clients:
        await c.close()
    assert sum(received.values()) == groups * per_group
    for node_id in ("n1", "n2", "n3"):
        nodes.stop(node_id)  # clean stop: every node writes its tail
    audit_dirs = sorted(p for p in (tmp_path / "nodes").glob("*/data/audit"))
    assert len(audit_dirs) == 3
    for d in audit_dirs:
        shutil.copytree(d, history / d.parent.parent.name)
    result = job.run(spark, history)
    assert result.counts == NONE, result.examples
    assert result.history.malformed == 0 and result.history.torn == 0
    # Every segment is compact JSON of known fields: no file had to be read twice.
    assert result.history.rechecked == 0 and result.history.unknown_keys == {}
    kinds = result.stats["events"]
    assert kinds["client_sent"] == groups * per_group
    assert kinds["client_acked"] == groups * per_group
    assert kinds["acked"] >= groups * per_group
    assert {n["node"] for n in result.stats["per_node"]} <= {"n1", "n2", "n3"}
    assert pure.check(history) == NONE


def test_the_report_names_consumers_and_writes_readable_times() -> None:
    from pipeline.report import render

    at = 1_795_000_000_123_000_000  # 2026-11-18 11:06:40.123 UTC
    example = {"key": "orders/g1/3", "consumer": "c-9f2", "group": "g1", "group_seq": 3}
    event = {"ts_ns": at, "kind": "delivered", "key": "orders/g1/3", "consumer": "c-9f2"}
    summary = {
        "verdict": "violations",
        "violations": {"exclusivity": 1},
        "examples": {"exclusivity": [example]},
        "example_events": {"orders/g1/3": [event]},
        "input": {"directory": "h", "files": 1, "lines": 1},
        "seconds": 1.0,
        "warnings": [],
        "notes": [],
        "stats": {
            "per_consumer": [
                {"node": "n1", "consumer": "c-9f2", "name": "worker-1", "groups": 1, "messages": 3}
            ],
            "skew": {},
        },
    }
    page = render(summary)
    assert "consumer=worker-1 (c-9f2)" in page
    assert "<td>worker-1 (c-9f2)</td>" in page
    assert "<td>2026-11-18 11:06:40.123</td>" in page
