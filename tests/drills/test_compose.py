"""Container drills: the compose cluster (docker-compose.yml, deploy/Dockerfile,
deploy/compose/*.yaml) as users run it, its image built the way `make up` builds it (offline
when no registry answers), brought up by testcontainers (tests/compose_nodes.py), under the
same audited grouped load as the process drills (tests/ha_load.py: the Python client with
the pair's address list, stomp.py with its host list, clients of node2 and node3). Each drill
ends with `pinmq check` on the audit logs every container wrote to its bind-mounted directory:
nothing lost, doubled or reordered, no group at two consumers, one route per binding and
epoch; it prints the failover moments the report found, with their gaps.

Every cluster has a project name and host ports of its own, and is removed with its volumes
after, pass or fail. Its nodes speak TLS and want a user: every client, the CLI and stomp.py
alike, comes over TLS as the user admin of the development secrets (secrets/, `make secrets`).
Without a Docker engine these tests skip, except under CI=true. The image is built as
pinmq:test, or as $PINMQ_TEST_IMAGE (two checkouts testing on one engine at once).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import waiting
from compose_nodes import (
    IMAGE,
    REPO,
    SERVICES,
    VOLUMES,
    ComposeCluster,
    build_image,
    compose_env,
)
from ha_load import QUEUE, HaLoad
from log_levels import loud, stopped
from ports import reserve_port
from watchdog import watchdog

from broker.info import HaPairStatus
from cluster.bridge import sf_queue

# container drills: an image build, then a minute a drill
pytestmark = [pytest.mark.slow, pytest.mark.containers]

KINDS = ("client", "stomp", "http")  # the ports `make up` prints for each node
DRILL_LIMIT_S = 360  # a drill takes 60-80 s under CI's load: past this one hangs


@pytest.fixture(scope="module")
def image() -> str:
    return build_image(IMAGE)


@asynccontextmanager
async def drill(
    tmp_path: Path, image: str, monkeypatch: pytest.MonkeyPatch, ha_all: bool = False
) -> AsyncIterator[tuple[ComposeCluster, HaLoad]]:
    cluster = ComposeCluster(tmp_path, image, monkeypatch, ha_all)
    load = HaLoad(cluster, tmp_path / "history", cluster.access)
    try:
        async with watchdog(DRILL_LIMIT_S, "the container drill"):
            try:
                await asyncio.to_thread(cluster.start)
                await load.start()
                yield cluster, load
            finally:
                await load.close()
    finally:
        logs = await asyncio.to_thread(cluster.compose, "logs", "--no-color", "-t")
        (tmp_path / "containers.log").write_text(logs)  # kept for a failure's post-mortem
        await asyncio.to_thread(cluster.down)


async def under_way(sends: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """The load's sends started, and going for a moment: the fault comes under load."""
    sending = asyncio.create_task(sends)
    await asyncio.sleep(0.3)
    return sending


async def pair_status(
    cluster: ComposeCluster, logical: str = "node1", asked: str = "node2"
) -> HaPairStatus:
    """A pair as `asked` last heard of it (asked again for up to 30 s: under load a node can
    take longer than a connect timeout to answer)."""
    url = cluster.client_url(asked)
    async with cluster.access.client(url, failover_timeout=30) as client:
        [pair] = [p for p in (await client.cluster_status()).ha if p.logical == logical]
    return pair


async def until(what: str, check: Any, timeout: float = 60.0) -> Any:
    """Containers restart slowly, and a node between lives answers nothing: ask again."""
    return await waiting.until(what, check, timeout, every=0.2, ignoring=(Exception,))


async def backup_serves(
    cluster: ComposeCluster, logical: str = "node1", asked: str = "node2"
) -> None:
    """Until `asked` hears that the backup of `logical` is its active process."""

    async def took_over() -> bool:
        status = await pair_status(cluster, logical, asked)
        return status.active == f"{logical}-backup"

    await until(f"{logical}-backup serves as {logical}", took_over)


async def pair_settles(
    cluster: ComposeCluster, active: str, backup: str, logical: str = "node1", asked: str = "node2"
) -> None:
    """Until `asked` hears `active` serve `logical` with `backup` following it, in sync."""

    async def settled() -> bool:
        pair = await pair_status(cluster, logical, asked)
        return (pair.active, pair.backup, pair.backup_in_sync) == (active, backup, True)

    await until(f"{active} serves {logical}, {backup} follows in sync", settled)


def report(stats: dict[str, Any]) -> None:
    """The failover moments `pinmq check` found, with the longest delivery gap around each."""
    for m in stats["failovers"]:
        print(
            f"failover: {m['what']}: delivery gap {m['gap_ms']:.0f} ms, "
            f"{m['groups_stalled']} groups stalled up to {m['group_gap_ms']:.0f} ms"
        )


async def test_docker_kill_of_node1_under_load_its_backup_container_takes_over(
    tmp_path: Path, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with drill(tmp_path, image, monkeypatch) as (cluster, load):
        await load.send(range(0, 10))
        before = await pair_status(cluster)
        assert (before.active, before.backup, before.backup_in_sync) == (
            "node1",
            "node1-backup",
            True,
        )
        await killed_under_load(cluster, load, "node1", backup_serves, tmp_path)


async def killed_under_load(
    cluster: ComposeCluster,
    load: HaLoad,
    service: str,
    taken_over: Callable[[ComposeCluster], Awaitable[None]],
    tmp_path: Path,
) -> None:
    """`docker kill` of a pair's active container under load, until `taken_over`; the load
    goes on and ends with a clean check that shows the node's run ended."""
    sending = await under_way(load.send(range(10, 30)))
    await asyncio.to_thread(lambda: cluster.docker("kill", service=service))
    await taken_over(cluster)
    await sending
    await load.send(range(30, 40))
    assert not load.failures
    stats = await load.finish(tmp_path / "report")
    report(stats)
    moments = [f["what"] for f in stats["failovers"]]
    assert any(m.startswith(f"node {service} stopped (back after") for m in moments), moments


async def test_every_node_a_pair_docker_kill_of_node2_its_backup_container_takes_over(
    tmp_path: Path, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docker-compose.ha-all.yml: six containers, every node a pair. node2's container (a
    REMOTE node's primary) is killed under load; node2-backup serves node2 for the clients
    that have both addresses and for the other nodes' store-and-forward queues."""
    async with drill(tmp_path, image, monkeypatch, ha_all=True) as (cluster, load):
        await load.send(range(0, 10))

        async def in_sync() -> bool:
            pairs = [await pair_status(cluster, n, asked="node3") for n in ("node1", "node2")]
            return all(p.backup_in_sync for p in pairs)

        await until("node3 hears both pairs in sync", in_sync)
        node2_backup = functools.partial(backup_serves, logical="node2", asked="node3")
        await killed_under_load(cluster, load, "node2", node2_backup, tmp_path)


async def test_every_node_a_pair_node2_paused_then_its_backup_cut_off_each_takes_over_in_turn(
    tmp_path: Path, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docker-compose.ha-all.yml, a REMOTE pair's two other faults, one after the other under
    load: node2's primary container frozen (`docker pause`) until node2-backup serves node2,
    then thawed: it fences itself and follows. Then node2-backup, active now, cut off the
    network until node2 serves again; back on, it follows. The Python clients have both of
    node2's addresses, the other nodes forward to whichever serves."""
    async with drill(tmp_path, image, monkeypatch, ha_all=True) as (cluster, load):
        node2 = functools.partial(pair_settles, cluster, logical="node2", asked="node3")
        await load.send(range(0, 10))
        await node2("node2", "node2-backup")
        sending = await under_way(load.send(range(10, 30)))
        await asyncio.to_thread(lambda: cluster.docker("pause", service="node2"))
        try:
            await backup_serves(cluster, logical="node2", asked="node3")
        finally:
            await asyncio.to_thread(lambda: cluster.docker("unpause", service="node2"))
        await node2("node2-backup", "node2")
        await sending
        sending = await under_way(load.send(range(30, 50)))
        await asyncio.to_thread(cluster.disconnect, "node2-backup")
        try:

            async def node2_serves() -> bool:
                return (await pair_status(cluster, "node2", "node3")).active == "node2"

            await until("node2 serves node2 again", node2_serves)
        finally:
            await asyncio.to_thread(cluster.connect, "node2-backup")
        await node2("node2", "node2-backup")
        await sending
        await load.send(range(50, 60))
        assert not load.failures
        stats = await load.finish(tmp_path / "report")
    report(stats)


async def test_docker_pause_of_node1_it_fences_itself_and_rejoins_as_the_backup(
    tmp_path: Path, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with drill(tmp_path, image, monkeypatch) as (cluster, load):
        await load.send(range(0, 10))
        sending = await under_way(load.send(range(10, 30)))
        await asyncio.to_thread(lambda: cluster.docker("pause", service="node1"))
        try:
            await backup_serves(cluster)
            await asyncio.sleep(1.0)  # it serves while node1 is still frozen
        finally:
            await asyncio.to_thread(lambda: cluster.docker("unpause", service="node1"))

        await pair_settles(cluster, "node1-backup", "node1")
        await sending
        await load.send(range(30, 40))
        assert not load.failures
        stats = await load.finish(tmp_path / "report")
    report(stats)


async def linked(cluster: ComposeCluster, url: str, peer: str) -> bool:
    """Whether the node at `url` has a live cluster link to `peer`."""
    async with cluster.client(url) as client:
        return (await client.cluster_status()).connected.get(peer, False)


def audited(history: Path, kind: str, queue: str, node: str = "node*") -> list[int]:
    """When (ns) the nodes' audit logs recorded `kind` events of `queue`."""
    times = []
    for segment in history.glob(f"{node}/*.jsonl"):
        for line in segment.read_text().splitlines():
            event = json.loads(line)
            if event["kind"] == kind and event.get("queue") == queue:
                times.append(event["ts_ns"])
    return times


async def test_docker_network_disconnect_of_node2_its_groups_wait_and_it_rejoins(
    tmp_path: Path, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """node2 off the cluster network (and so off its published ports) while the load goes on
    through node3 and the pair: the groups bound to node2's queue wait in the senders'
    store-and-forward queues, no other consumer takes them. Back on the network, with maybe a
    new address (each node binds 0.0.0.0 and advertises its service name), it is found again
    and serves them, in order."""
    async with drill(tmp_path, image, monkeypatch) as (cluster, load):
        await load.send(range(0, 10))
        sending = await under_way(load.send(range(10, 20), remote="node3"))
        before = cluster.address("node2")
        await asyncio.to_thread(cluster.disconnect, "node2")
        cut_at = time.time_ns()
        try:

            async def cut_off() -> bool:
                return not await linked(cluster, cluster.pair_url, "node2")

            await sending
            await load.send(range(20, 30), remote="node3")  # all of it while node2 is away
            await until("the pair notices node2 is gone", cut_off)
        finally:
            cut = (cut_at, time.time_ns())
            await asyncio.to_thread(cluster.connect, "node2")
        print(f"node2 rejoined at {cluster.address('node2')} (was {before})")

        async def rejoined() -> bool:
            url = cluster.client_url("node2")
            return all([await linked(cluster, url, peer) for peer in ("node1", "node3")])

        await until("node2 linked to node1 and node3 again", rejoined)
        await load.add_worker("py-node2-again", cluster.client_url("node2"))
        await load.send(range(30, 40))  # through node2 again
        assert not load.failures
        stats = await load.finish(tmp_path / "report")
    report(stats)
    # node2's groups were sent to while it was away: those messages waited for it, in the
    # other nodes' store-and-forward queues, and reached it once it was back.
    history, (start, end) = tmp_path / "history", cut
    held = [t for t in audited(history, "sent", sf_queue("pinmq", "node2")) if start <= t <= end]
    assert held
    arrived = [t for t in audited(history, "sent", QUEUE, "node2") if t > end]
    print(
        f"node2 cut off for {(end - start) / 1e9:.1f} s: {len(held)} messages held for it; "
        f"the first reached it {(min(arrived) - end) / 1e6:.0f} ms after it was reconnected"
    )


async def test_docker_restart_of_node3_and_of_the_whole_stack_keep_every_message(
    tmp_path: Path, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with drill(tmp_path, image, monkeypatch) as (cluster, load):
        await load.send(range(0, 10))
        sending = await under_way(load.send(range(10, 20)))
        await asyncio.to_thread(lambda: cluster.docker("restart", service="node3"))
        await asyncio.to_thread(cluster.compose, "up", "-d", "--wait")  # node3 healthy again
        await sending
        await load.add_worker("py-node3-again", cluster.client_url("node3"))
        await load.send(range(20, 25))
        # The whole stack: stopped (volumes kept), then up again: everything acknowledged
        # before is still there, and the clients of the pair find it again by themselves.
        await asyncio.to_thread(cluster.compose, "stop")
        await asyncio.to_thread(cluster.compose, "up", "-d", "--wait")
        for name in ("node2", "node3"):
            await load.add_worker(f"py-{name}-restarted", cluster.client_url(name))
        await load.send(range(25, 35))
        assert not load.failures
        stats = await load.finish(tmp_path / "report")
    report(stats)


def make(target: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        ["make", "--no-print-directory", target],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"make {target}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def shell(command: str, env: dict[str, str]) -> str:
    """A line from the README or from `make up`, as a user runs it: from the repository (where
    `source secrets/client.env` finds the CLI's settings), the venv on PATH."""
    path = f"{REPO / '.venv' / 'bin'}:{env['PATH']}"
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=REPO,
        env={**env, "PATH": path},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def project_objects(kind: str, project: str) -> list[str]:
    """The project's containers (`ps`) or volumes (`volume`), by compose's label."""
    label = f"label=com.docker.compose.project={project}"
    every = ["--all"] if kind == "container" else []
    listing = ["docker", kind, "ls", *every, "-q", "--filter", label]
    return subprocess.run(listing, check=True, capture_output=True, text=True).stdout.split()


# What `docker compose logs -f` adds once a followed container stops.
EXITED = re.compile(r"(?:\x1b\[K)?(\S+) exited with code (\d+)")


def following_logs(tmp_path: Path, env: dict[str, str]) -> dict[str, subprocess.Popen[bytes]]:
    """`docker compose logs -f` of each service into tmp_path/<service>.log, from its start
    until its container stops."""
    followers = {}
    for name in SERVICES:
        with open(tmp_path / f"{name}.log", "wb") as out:
            followers[name] = subprocess.Popen(
                ["docker", "compose", "logs", "--no-color", "--no-log-prefix", "-f", name],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
    return followers


def followed_to_the_end(
    tmp_path: Path, followers: dict[str, subprocess.Popen[bytes]]
) -> dict[str, list[str]]:
    """Each service's log lines, once its container stopped with exit code 0 (the line that
    `logs -f` adds then is checked and left out)."""
    logs = {}
    for name, follower in followers.items():
        follower.wait(timeout=60)
        lines = (tmp_path / f"{name}.log").read_text(errors="replace").splitlines()
        exits = [m.groups() for line in lines if (m := EXITED.fullmatch(line))]
        assert exits == [(f"{name}-1", "0")], lines[-5:]
        logs[name] = [line for line in lines if line and not EXITED.fullmatch(line)]
    return logs


def test_make_up_prints_working_endpoints_and_make_down_keeps_the_data(
    tmp_path: Path, image: str
) -> None:
    """The README's main command with a Docker engine (`make up` runs `make up-docker`): the
    cluster healthy, its status, each node's endpoints as published and a try line that works;
    `make down` removes the containers and keeps the volumes, so a second `make up` still has
    what was sent. Under a project and host ports of its own (PINMQ_<NODE>_<KIND>_PORT). The
    fresh cluster is elected at epoch 1, and no node logs anything at warning or above from
    its start until `make down` stopped it. The try line logs in with `make secrets`'s
    client.env, as the README's tours do."""
    env = {**os.environ, **compose_env(tmp_path, image)}
    ports = {name: {kind: reserve_port() for kind in KINDS} for name in SERVICES}
    for name, kinds in ports.items():
        for kind, port in kinds.items():
            env[f"PINMQ_{name.upper().replace('-', '_')}_{kind.upper()}_PORT"] = str(port)
    project = env["COMPOSE_PROJECT_NAME"]
    try:
        out = make("up-docker", env)
        assert "active process node1, epoch 1, backup node1-backup in sync" in out, out
        for name, kinds in ports.items():
            shown = " ".join(f"{kind} 127.0.0.1:{port}" for kind, port in kinds.items())
            assert any(
                line.startswith(name + " ") and " ".join(line.split()[1:7]) == shown
                for line in out.splitlines()
            ), out
        [tried] = [
            line.removeprefix("try: ") for line in out.splitlines() if line.startswith("try: ")
        ]
        assert (
            f"127.0.0.1:{ports['node1']['client']},127.0.0.1:{ports['node1-backup']['client']}"
            in tried
        )
        assert tried.startswith("source secrets/client.env && pinmq send "), tried
        lines = shell(tried, env).splitlines()
        assert lines[0] == "sent 5 messages to orders in group g1"
        got = [json.loads(line) for line in lines[1:]]
        assert [(m["group"], m["group_seq"], m["body"]) for m in got] == [
            ("g1", i, "hi") for i in range(1, 6)
        ]
        node2 = f"127.0.0.1:{ports['node2']['client']}"
        login = "source secrets/client.env && "
        shell(f"{login}pinmq send orders --url {node2} --group kept --count 3 --body kept", env)
        followers = following_logs(tmp_path, env)
        make("down-docker", env)
        logs = followed_to_the_end(tmp_path, followers)
        assert all(stopped(lines) for lines in logs.values()), {n: x[-5:] for n, x in logs.items()}
        loud_lines = {n: found for n, lines in logs.items() if (found := loud(lines))}
        assert not loud_lines, json.dumps(loud_lines, indent=1)
        assert project_objects("container", project) == []
        assert len(project_objects("volume", project)) == len(VOLUMES)
        make("up-docker", env)
        again = shell(
            f"{login}pinmq consume orders --url {node2} --count 3 --json --timeout 30", env
        )
        assert [json.loads(line)["body"] for line in again.splitlines()] == ["kept"] * 3
    finally:
        subprocess.run(
            ["docker", "compose", "down", "--volumes"],
            cwd=REPO,
            env=env,
            capture_output=True,
            timeout=300,
        )
    assert project_objects("container", project) == project_objects("volume", project) == []
