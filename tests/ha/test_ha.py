"""ha drills with real processes: the LOCAL node as a primary and a replicated backup, two
REMOTE nodes that vote (tests/ha_nodes.py), under audited grouped load (tests/ha_load.py):
Python clients with the pair's address list, stomp.py with its host list, and clients of the
REMOTE nodes, producing and consuming through each fault. Every drill ends with `pinmq check`
on the history of every process and client: nothing lost, doubled or reordered, no group at
two consumers, one route per binding and epoch. Waits are bounded; nothing is timed."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import cli, get
from ha_load import AUDIT, HaLoad
from ha_load import GROUPS as LOAD_GROUPS
from ha_nodes import BACKUP, PRIMARY, HaCluster, ha_detail, ready, serving
from waiting import until
from watchdog import watchdog

pytestmark = pytest.mark.slow  # failover drills under audited load, each a minute or so
DRILL_LIMIT_S = 300  # a drill takes up to a minute under CI's load: past this one hangs


@asynccontextmanager
async def drill(tmp_path: Path, **cluster: Any) -> AsyncIterator[tuple[HaCluster, HaLoad]]:
    """The audited cluster, started with its load's consumers; everything stopped after."""
    (tmp_path / "nodes").mkdir()
    ha = HaCluster(tmp_path / "nodes", extra=AUDIT, **cluster)
    load = HaLoad(ha, tmp_path / "history")
    try:
        async with watchdog(DRILL_LIMIT_S, "the drill"):
            try:
                ha.start()
                await load.start()
                yield ha, load
            except BaseException:
                _print_pair_history(ha)
                raise
            finally:
                await load.close()
    finally:
        ha.kill_all()


PAIR_EVENTS = ("failover state", "serving", "took over", "in sync", "stopped", "started")


def _print_pair_history(ha: HaCluster) -> None:
    """A failed drill shows how the pair moved (pytest prints it with the failure): which
    process stood, won, lost or synced when, and whether one exited."""
    for name in (PRIMARY, BACKUP):
        node = ha.nodes[name]
        proc = node.proc
        print(f"---- {name} (exit code {proc.poll() if proc else None}) ----")
        for line in node.log().splitlines():
            if any(event in line for event in PAIR_EVENTS) or '"level": "error"' in line:
                print(line[:400])


async def test_kill_9_of_the_primary_under_load_the_backup_takes_over(
    tmp_path: Path,
) -> None:
    """Grouped producers and consumers (Python with the address list, stomp.py with the host
    list, and on the REMOTE nodes) run through a kill -9 of the primary; `pinmq check` on the
    audit history of every process and client finds nothing lost, doubled or reordered, no
    group at two consumers, one route per binding and epoch."""
    async with drill(tmp_path) as (ha, load):
        await load.send(range(0, 10))
        await until(
            "every process knows the backup is in sync",
            lambda: ha.in_sync(ha.primary),
            off_loop=True,
        )
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
        await until(
            "the backup serves",
            lambda: serving(ha.backup),
            off_loop=True,
        )
        ha_epoch = ha_detail(ha.backup, "epoch")
        assert ha_epoch > first_epoch
        assert ha_detail(ha.backup, "logical") == PRIMARY
        # Health says at every moment which process is the active arbiter, and at which epoch.
        await until(
            "node2 hears of the new active",
            lambda: "active process node1-backup" in cli("status", "--url", node2).stdout,
            off_loop=True,
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
        stats = await load.finish(tmp_path / "report")
        # A takeover warns that it took over, and logs no error on the way. It paged its
        # groups from the index it kept while following, not from a scan of its store.
        lines = ha.backup.log().splitlines()
        assert [line for line in lines if '"level": "error"' in line] == []
        [started] = [json.loads(line) for line in lines if '"event": "node started"' in line]
        assert started["restored_from"] == "kept index"
    # The report shows the failover: node1's run ended and another began (the backup's), and
    # groups bound after it carry the new arbiter's epoch.
    moments = [f["what"] for f in stats["failovers"]]
    assert any(m.startswith("node node1 stopped (back after") for m in moments), moments
    assert any(m == f"epoch {ha_epoch} began" for m in moments), moments
    assert load.stomp_producer.link.opened >= 2  # the STOMP clients moved too
    assert load.stomp_consumer.link.opened >= 2


async def test_a_frozen_primary_fences_itself_and_rejoins_as_the_backup(tmp_path: Path) -> None:
    """SIGSTOP of the primary past failure-timeout under load: the backup is elected; the
    primary, woken, finds its promises expired and stops serving before anything else, and
    follows the backup. Its clients move to the backup, a consumer and a producer whose call
    passed its deadline before keepalive noticed the freeze among them."""
    async with drill(tmp_path) as (ha, load):
        await load.send(range(0, 10))
        primary = ha.primary
        assert primary.proc is not None
        hasty = await load.producing_client("py-hasty", ha.pair_url, call_timeout=1.0)
        assert hasty.target == primary.url
        sending = asyncio.create_task(load.send(range(10, 30)))
        await asyncio.sleep(0.3)
        primary.proc.send_signal(signal.SIGSTOP)
        hasty_send = asyncio.create_task(load.send_first(hasty, LOAD_GROUPS + 2))
        try:
            await until(
                "the backup serves as node1",
                lambda: serving(ha.backup),
                off_loop=True,
            )
            await asyncio.sleep(1.0)  # the backup serves while the primary still sleeps
        finally:
            primary.proc.send_signal(signal.SIGCONT)
        await until(
            "the old primary is passive",
            lambda: ha_detail(primary, "role") == "passive",
            off_loop=True,
        )
        assert not serving(primary)
        await sending
        await hasty_send  # past its deadline at the primary, then sent again to the backup
        assert hasty.target == ha.backup.url
        [pair_consumer] = [w for w in load.workers if w.name == "py-pair"]
        assert load.clients[load.workers.index(pair_consumer)].target == ha.backup.url
        await until(
            "the old primary in sync",
            lambda: ha_detail(ha.backup, "backup_in_sync"),
            off_loop=True,
        )
        await load.send(range(30, 40))
        assert not load.failures
        stats = await load.finish(tmp_path / "report")
    assert "stopped serving: fenced" in primary.log()
    assert any(f["what"].startswith("node node1 stopped") for f in stats["failovers"])


async def test_a_frozen_backup_is_dropped_and_the_primary_carries_on(tmp_path: Path) -> None:
    """The first write waits for the frozen backup, which never answers: past failure-timeout
    the primary drops it, the voters hear it is out of sync, and writes go on. The backup
    comes back with a fresh snapshot, and then holds everything: the primary's kill -9 loses
    nothing."""
    async with drill(tmp_path) as (ha, load):
        backup = ha.backup
        assert backup.proc is not None
        backup.proc.send_signal(signal.SIGSTOP)
        try:
            await load.send(range(0, 10))
            assert ha_detail(ha.primary, "backup_in_sync") is False
            assert "backup lost: carrying on without it" in ha.primary.log()
        finally:
            backup.proc.send_signal(signal.SIGCONT)
        # A takeover needs the backup and both voters to know: the primary knows first.
        await until(
            "all know the backup is in sync again",
            lambda: ha.in_sync(ha.primary),
            off_loop=True,
        )
        await load.send(range(10, 20))
        ha.primary.kill()
        await until(
            "the backup serves as node1",
            lambda: serving(ha.backup),
            off_loop=True,
        )
        await load.send(range(20, 30))
        assert not load.failures
        await load.finish(tmp_path / "report")


async def test_kill_9_of_the_backup_the_primary_carries_on_and_the_backup_catches_up(
    tmp_path: Path,
) -> None:
    async with drill(tmp_path) as (ha, load):
        await load.send(range(0, 10))
        sending = asyncio.create_task(load.send(range(10, 30)))
        await asyncio.sleep(0.3)
        ha.backup.kill()  # under load: the primary goes on alone once the voters know
        await sending
        assert ha_detail(ha.primary, "backup_in_sync") is False
        ha.backup.start(wait=False)
        sending = asyncio.create_task(load.send(range(30, 40)))  # it catches up meanwhile
        await until(
            "all know the backup is in sync again",
            lambda: ha.in_sync(ha.primary),
            off_loop=True,
        )
        await sending
        ha.primary.kill()  # the caught-up backup has everything
        await until(
            "the backup serves as node1",
            lambda: serving(ha.backup),
            off_loop=True,
        )
        await load.send(range(40, 50))
        assert not load.failures
        await load.finish(tmp_path / "report")


async def test_failback_returns_node1_to_the_primary_without_losing_a_message(
    tmp_path: Path,
) -> None:
    async with drill(tmp_path, ha={"allow-failback": True}) as (ha, load):
        await load.send(range(0, 10))
        ha.primary.kill()
        await until(
            "the backup serves as node1",
            lambda: serving(ha.backup),
            off_loop=True,
        )
        await load.send(range(10, 20))
        ha.primary.start(wait=False)  # it rejoins as the backup, syncs, and takes over
        sending = asyncio.create_task(load.send(range(20, 40)))  # through the handover
        await until(
            "the primary serves again",
            lambda: serving(ha.primary),
            timeout=60,
            off_loop=True,
        )
        assert ha_detail(ha.primary, "epoch") > 2
        await until(
            "the backup is passive",
            lambda: not serving(ha.backup),
            off_loop=True,
        )
        await sending
        await load.send(range(40, 50))
        assert not load.failures
        await load.finish(tmp_path / "report")


async def test_kill_9_of_a_remote_node_the_pair_carries_on(tmp_path: Path) -> None:
    """node3 killed under load: node1 still holds promises from node2 and its backup. node3's
    groups wait for it (in the senders' store-and-forward queues) until it returns."""
    async with drill(tmp_path) as (ha, load):
        await load.send(range(0, 10))
        sending = asyncio.create_task(load.send(range(10, 30)))
        await asyncio.sleep(0.3)
        ha.nodes["node3"].kill()
        await sending
        assert serving(ha.primary) and ha_detail(ha.primary, "backup_in_sync")
        await asyncio.to_thread(ha.nodes["node3"].start)
        await load.add_worker("py-node3-again", ha.nodes["node3"].url)
        await load.send(range(30, 40))
        assert not load.failures
        await load.finish(tmp_path / "report")


async def test_kill_9_of_a_remote_nodes_primary_under_load_its_backup_takes_over(
    tmp_path: Path,
) -> None:
    """node2, a REMOTE node, runs as a pair; node1 (LOCAL) and node3 vote. Its primary is
    killed under load: its backup serves node2 with every message it held, the peers'
    store-and-forward queues follow it, clients with the pair's address list move to it, and
    its groups go on at its consumers. `pinmq check` finds nothing lost, doubled, reordered
    or at two consumers."""
    async with drill(tmp_path, paired="node2") as (ha, load):
        await load.send(range(0, 10))  # the odd groups through node1, the even via the pair
        await until(
            "every process knows the backup is in sync",
            lambda: ha.in_sync(ha.primary),
            off_loop=True,
        )
        node3 = ha.nodes["node3"].url
        status = cli("status", "--cluster", "--url", node3).stdout
        assert re.search(
            r"ha node2: active process node2, epoch \d+, backup node2-backup in sync", status
        ), status
        sending = asyncio.create_task(load.send(range(10, 40)))
        await asyncio.sleep(0.3)  # under load
        ha.primary.kill()  # kill -9
        await until("the backup serves", lambda: serving(ha.backup), off_loop=True)
        assert ha_detail(ha.backup, "logical") == "node2"
        await until(
            "node3 hears of node2's new active process",
            lambda: "ha node2: active process node2-backup" in cli("status", "--url", node3).stdout,
            off_loop=True,
        )
        await sending
        await load.send(range(40, 50), remote="node3")
        await load.send_new_group(LOAD_GROUPS, ha.pair_url)
        assert not load.failures  # every send got through, retried or not
        assert len(load.confirmed) == LOAD_GROUPS * 50 + 1
        stats = await load.finish(tmp_path / "report")
        lines = ha.backup.log().splitlines()
        assert [line for line in lines if '"level": "error"' in line] == []
    moments = [f["what"] for f in stats["failovers"]]
    assert any(m.startswith("node node2 stopped (back after") for m in moments), moments


async def test_the_whole_cluster_restarts_with_every_acknowledged_message(tmp_path: Path) -> None:
    async with drill(tmp_path) as (ha, load):
        await load.send(range(0, 15))
        for node in ha.nodes.values():
            node.kill()  # kill -9, all at once
        for node in ha.nodes.values():
            node.start(wait=False)
        # One of the pair is elected again: both hold everything that was acknowledged.
        await until(
            "one of the pair is ready",
            lambda: ready(ha.primary) or ready(ha.backup),
            off_loop=True,
        )
        for name in ("node2", "node3"):
            await asyncio.to_thread(ha.nodes[name].wait_serving)
            await load.add_worker(f"py-{name}-again", ha.nodes[name].url)
        await load.send(range(15, 30))
        assert not load.failures
        await load.finish(tmp_path / "report")


async def test_a_cut_between_primary_and_backup_never_activates_the_backup(
    tmp_path: Path,
) -> None:
    async with drill(tmp_path, proxied=True) as (ha, load):  # both still reach node2, node3
        await load.send(range(0, 10))
        ha.cut_pair()
        # The backup hears no heartbeat and asks for votes, but node2 and node3 still hear
        # the primary and keep their promises to it: for 3 failure-timeouts, nothing moves.
        sending = asyncio.create_task(load.send(range(10, 30)))
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            assert not serving(ha.backup)
            assert ha_detail(ha.backup, "role") != "active"
            await asyncio.sleep(0.05)
        await sending  # the primary dropped its backup and went on
        assert serving(ha.primary) and ha_detail(ha.primary, "backup_in_sync") is False
        ha.heal_pair()
        # Not the primary's view alone: the backup and the voters must know before the kill,
        # else the backup (rightly) never stands.
        await until(
            "all know the backup is in sync again",
            lambda: ha.in_sync(ha.primary),
            off_loop=True,
        )
        ha.primary.kill()
        await until(
            "the backup serves as node1",
            lambda: serving(ha.backup),
            off_loop=True,
        )
        await load.send(range(30, 40))
        assert not load.failures
        await load.finish(tmp_path / "report")
