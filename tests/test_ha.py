"""ha drills with real processes: the LOCAL node as a primary and a replicated backup, two
REMOTE nodes that vote (tests/ha_nodes.py). Each drill ends by reading back what was
acknowledged: every message, once, in group order."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import cli, get
from ha_load import AUDIT, HaLoad
from ha_load import GROUPS as LOAD_GROUPS
from ha_nodes import BACKUP, PRIMARY, HaCluster, ha_detail, ready, serving, wait

from broker.client import Client

QUEUE = "orders"
GROUPS = [f"g{i}" for i in range(8)]


@pytest.fixture
def ha(tmp_path: Path) -> Iterator[HaCluster]:
    cluster = HaCluster(tmp_path)
    yield cluster
    cluster.kill_all()


async def send(url: str, start: int, count: int) -> None:
    async with Client(url) as client:
        producers = {g: client.producer(QUEUE, group_id=g) for g in GROUPS}
        for i in range(start, start + count):
            group = GROUPS[i % len(GROUPS)]
            await producers[group].send(f"{group}:{i}")


async def read_back(url: str, count: int) -> None:
    """Consume `count` messages (failing if fewer come), then check nothing else is there."""
    got: dict[str, list[int]] = {g: [] for g in GROUPS}
    async with Client(url) as client, client.consumer(QUEUE) as consumer:
        for _ in range(count):
            msg = await consumer.receive(timeout=30)
            assert msg is not None, f"only {sum(map(len, got.values()))} of {count} came back"
            group, _, seq = msg.text.partition(":")
            got[group].append(int(seq))
            await msg.ack()
        assert await consumer.receive(timeout=0.5) is None  # and nothing twice
    for group, seqs in got.items():
        assert seqs == sorted(seqs), f"{group} out of order: {seqs}"
    every = sorted(i for seqs in got.values() for i in seqs)
    assert every == list(range(count)), "not every message sent, once each"


async def test_kill_9_of_the_primary_under_load_the_backup_takes_over(
    tmp_path: Path,
) -> None:
    """Grouped producers and consumers (Python with the address list, stomp.py with the host
    list, and on the REMOTE nodes) run through a kill -9 of the primary; `pinmq check` on the
    audit history of every process and client finds nothing lost, doubled or reordered, no
    group at two consumers, one route per binding and epoch."""
    (tmp_path / "nodes").mkdir()
    ha = HaCluster(tmp_path / "nodes", extra=AUDIT)
    load = HaLoad(ha, tmp_path / "history")
    try:
        ha.start()
        await load.start()
        await load.send(range(0, 10))
        wait("the backup knows it is in sync", lambda: ha_detail(ha.backup, "in_sync"))
        assert not serving(ha.backup)  # passive: its client listener is closed
        code, body = get(ha.backup.http, "/readyz")
        assert code == 503 and body["ha"]["replication"] == "following"
        node2 = ha.nodes["node2"].url
        status = cli("status", "--cluster", "--url", node2)
        found = re.search(
            r"ha node1: active process node1, epoch (\d+), backup node1-backup in sync",
            status.stdout,
        )
        assert found, status.stdout
        first_epoch = int(found.group(1))
        sending = asyncio.create_task(load.send(range(10, 40)))
        await asyncio.sleep(0.3)  # under load
        ha.primary.kill()  # kill -9
        await asyncio.to_thread(wait, "the backup serves", lambda: serving(ha.backup))
        ha_epoch = ha_detail(ha.backup, "epoch")
        assert ha_epoch > first_epoch
        assert ha_detail(ha.backup, "logical") == PRIMARY
        # Health says at every moment which process is the active arbiter, and at which epoch.
        await asyncio.to_thread(
            wait,
            "node2 hears of the new active",
            lambda: "active process node1-backup" in cli("status", "--url", node2).stdout,
        )
        status = json.loads(cli("status", "--json", "--url", ha.backup.url).stdout)
        [pair] = status["ha"]
        assert (pair["active"], pair["from_active"], pair["backup_in_sync"]) == (
            BACKUP,
            True,
            False,
        )
        await sending
        await load.send(range(40, 50))
        # Groups bound by the new arbiter, asked by itself and by a REMOTE node.
        await load.send_new_group(LOAD_GROUPS, ha.pair_url)
        await load.send_new_group(LOAD_GROUPS + 1, node2)
        assert not load.failures  # every send got through, retried or not
        assert len(load.confirmed) == LOAD_GROUPS * 50 + 2
        await load.drained()
        await load.close()
        stats = await load.verdict(tmp_path / "report")
    finally:
        await load.close()
        ha.kill_all()
    # The report shows the failover: node1's run ended and another began (the backup's), and
    # groups bound after it carry the new arbiter's epoch.
    moments = [f["what"] for f in stats["failovers"]]
    assert any(m.startswith("node node1 stopped (back after") for m in moments), moments
    assert any(m == f"epoch {ha_epoch} began" for m in moments), moments
    assert load.stomp_producer.link.opened >= 2  # the STOMP clients moved too
    assert load.stomp_consumer.link.opened >= 2


async def test_a_frozen_backup_is_dropped_and_the_primary_carries_on(ha: HaCluster) -> None:
    ha.start()
    async with Client(ha.primary.url) as client:
        await client.create_queue(QUEUE)
    backup = ha.backup
    assert backup.proc is not None
    backup.proc.send_signal(signal.SIGSTOP)
    try:
        # The first send waits for the backup, which never answers: past failure-timeout the
        # primary drops it, the voters hear it is out of sync, and the send completes.
        await send(ha.primary.url, 0, 10)
        assert ha_detail(ha.primary, "backup_in_sync") is False
        assert "backup lost: carrying on without it" in ha.primary.log()
    finally:
        backup.proc.send_signal(signal.SIGCONT)
    ha.wait_in_sync(ha.primary)  # it comes back, takes a fresh snapshot
    await send(ha.primary.url, 10, 10)
    with sqlite3.connect(backup.data_dir / "store.db") as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM messages WHERE queue = ?", (QUEUE,)
        ).fetchone()
    assert count == 20


async def test_a_frozen_primary_fences_itself_and_rejoins_as_the_backup(ha: HaCluster) -> None:
    ha.start()
    async with Client(ha.primary.url) as client:
        await client.create_queue(QUEUE)
    await send(ha.primary.url, 0, 100)
    primary = ha.primary
    assert primary.proc is not None
    primary.proc.send_signal(signal.SIGSTOP)  # past failure-timeout: the backup is elected
    try:
        wait("the backup serves as node1", lambda: serving(ha.backup))
        await send(ha.backup.url, 100, 100)
    finally:
        primary.proc.send_signal(signal.SIGCONT)
    # Awake, it finds its promises expired: it stops serving before anything else and
    # follows the active backup instead.
    wait("the old primary is passive", lambda: ha_detail(primary, "role") == "passive")
    assert not serving(primary)
    ha.wait_in_sync(ha.backup)
    await read_back(ha.pair_url, 200)


async def test_kill_9_of_the_backup_the_primary_carries_on_and_the_backup_catches_up(
    ha: HaCluster,
) -> None:
    ha.start()
    async with Client(ha.primary.url) as client:
        await client.create_queue(QUEUE)
    await send(ha.primary.url, 0, 50)
    ha.backup.kill()
    await send(ha.primary.url, 50, 50)  # alone, once the voters know the backup is gone
    assert ha_detail(ha.primary, "backup_in_sync") is False
    ha.backup.start(wait=False)
    ha.wait_in_sync(ha.primary)
    await send(ha.primary.url, 100, 50)
    ha.primary.kill()  # the caught-up backup has everything
    wait("the backup serves as node1", lambda: serving(ha.backup))
    await read_back(ha.pair_url, 150)


async def test_failback_returns_node1_to_the_primary_without_losing_a_message(
    tmp_path: Path,
) -> None:
    ha = HaCluster(tmp_path, ha={"allow-failback": True})
    try:
        ha.start()
        async with Client(ha.primary.url) as client:
            await client.create_queue(QUEUE)
        await send(ha.pair_url, 0, 80)
        ha.primary.kill()
        wait("the backup serves as node1", lambda: serving(ha.backup))
        await send(ha.pair_url, 80, 80)
        ha.primary.start(wait=False)  # it rejoins as the backup, syncs, and takes over
        wait("the primary serves again", lambda: serving(ha.primary), timeout=60)
        assert ha_detail(ha.primary, "epoch") > 2
        wait("the backup is passive", lambda: not serving(ha.backup))
        await send(ha.pair_url, 160, 80)
        await read_back(ha.pair_url, 240)
    finally:
        ha.kill_all()


async def test_kill_9_of_a_remote_node_the_pair_carries_on(ha: HaCluster) -> None:
    ha.start()
    async with Client(ha.primary.url) as client:
        await client.create_queue(QUEUE)
    await send(ha.pair_url, 0, 40)
    ha.nodes["node3"].kill()  # one voter gone: node1 still holds promises from node2 and its backup
    await send(ha.nodes["node2"].url, 40, 20)
    await send(ha.pair_url, 60, 20)
    assert serving(ha.primary) and ha_detail(ha.primary, "backup_in_sync")
    await read_back(ha.pair_url, 80)


async def test_the_whole_cluster_restarts_with_every_acknowledged_message(ha: HaCluster) -> None:
    ha.start()
    async with Client(ha.primary.url) as client:
        await client.create_queue(QUEUE)
    await send(ha.pair_url, 0, 80)
    for node in ha.nodes.values():
        node.kill()  # kill -9, all at once
    for node in ha.nodes.values():
        node.start(wait=False)
    # One of the pair is elected again: both hold everything that was acknowledged.
    wait("one process of the pair is ready", lambda: ready(ha.primary) or ready(ha.backup))
    await send(ha.pair_url, 80, 40)
    await read_back(ha.pair_url, 120)


async def test_a_cut_between_primary_and_backup_never_activates_the_backup(
    tmp_path: Path,
) -> None:
    ha = HaCluster(tmp_path, proxied=True)  # both still reach node2 and node3
    try:
        ha.start()
        async with Client(ha.primary.url) as client:
            await client.create_queue(QUEUE)
        await send(ha.pair_url, 0, 40)
        ha.cut_pair()
        # The backup hears no heartbeat and asks for votes, but node2 and node3 still hear
        # the primary and keep their promises to it: for 3 failure-timeouts, nothing moves.
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            assert not serving(ha.backup)
            assert ha_detail(ha.backup, "role") != "active"
            time.sleep(0.05)
        await send(ha.pair_url, 40, 40)  # the primary dropped its backup and goes on
        assert serving(ha.primary) and ha_detail(ha.primary, "backup_in_sync") is False
        ha.heal_pair()
        ha.wait_in_sync(ha.primary)  # it catches up
        ha.primary.kill()
        wait("the backup serves as node1", lambda: serving(ha.backup))
        await read_back(ha.pair_url, 80)
    finally:
        ha.kill_all()
