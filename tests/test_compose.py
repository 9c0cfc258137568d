"""The compose cluster (docker-compose.yml, deploy/Dockerfile, deploy/compose/*.yaml) as users
run it: the image built the way `make up` builds it (offline when no registry answers), the
four containers up with `docker compose up --wait` (testcontainers' DockerCompose), and the
Python client on the published ports through a `docker kill` of node1.

Each test cluster has a project name of its own and ephemeral host ports
(tests/compose/ephemeral-ports.yaml); its containers, network and volumes are removed after,
pass or fail. Without a Docker engine these tests skip with the reason, except under CI=true,
where that is a failure: they must run there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import compose
import pytest
from testcontainers.compose import DockerCompose

from broker.client import Client

REPO = Path(__file__).resolve().parent.parent
IMAGE = "pinmq:test"
OVERRIDE = "tests/compose/ephemeral-ports.yaml"


def _engine() -> None:
    """Skip (fail under CI) unless a Docker engine answers."""
    try:
        answered = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        answered = None
    if answered is None or answered.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(
                "no Docker engine answers (docker info): the container tests must run in CI"
            )
        pytest.skip("no Docker engine answers (docker info)")


@pytest.fixture(scope="module")
def image() -> str:
    """pinmq:test from this checkout, built as `make image` builds pinmq:latest."""
    _engine()
    built = subprocess.run(
        [str(REPO / "deploy" / "build-image.sh"), sys.executable],
        cwd=REPO,
        env={**os.environ, "PINMQ_IMAGE": IMAGE},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return IMAGE


@pytest.fixture
def cluster(image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DockerCompose]:
    """The four containers, healthy; removed with their volumes after."""
    plugins = tmp_path / "docker" / "cli-plugins"
    plugins.mkdir(parents=True)
    (plugins / "docker-compose").symlink_to(Path(compose.__file__).with_name("docker-compose"))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))  # Compose v2 from PyPI
    monkeypatch.setenv("COMPOSE_PROJECT_NAME", f"pinmq-test-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("PINMQ_IMAGE", image)
    stack = DockerCompose(REPO, compose_file_name=["docker-compose.yml", OVERRIDE], wait=True)
    try:
        stack.start()
        yield stack
    finally:
        stack.stop(down=True)  # down --volumes


def client_url(stack: DockerCompose, *services: str) -> str:
    """The services' published client ports, as a client address list."""
    found = []
    for service in services:
        host, port = stack.get_service_host_and_port(service, 7601)
        found.append(f"{host or '127.0.0.1'}:{port}")
    return ",".join(found)


async def test_docker_kill_of_node1_its_backup_container_serves_every_acknowledged_message(
    cluster: DockerCompose,
) -> None:
    pair = client_url(cluster, "node1", "node1-backup")
    async with Client(pair) as client:
        producer = client.producer("orders", group_id="g")
        await producer.send_many([f"before-{i}" for i in range(50)], batch_size=10)
        status = await client.cluster_status()
    [ha] = status.ha
    assert (ha.active, ha.backup, ha.backup_in_sync) == ("node1", "node1-backup", True)
    node1 = cluster.get_container("node1")
    subprocess.run(["docker", "kill", node1.ID], check=True, capture_output=True, timeout=60)
    async with Client(pair) as client:  # the client finds the backup by itself
        producer = client.producer("orders", group_id="g")
        await producer.send_many([f"after-{i}" for i in range(50)], batch_size=10)
        [ha] = (await client.cluster_status()).ha
        assert (ha.active, ha.epoch) == ("node1-backup", 2)
        got = []
        async with client.consumer("orders", prefetch=200) as consumer:
            while (m := await consumer.receive(timeout=3)) is not None:
                got.append(m.text)
    assert got == [f"before-{i}" for i in range(50)] + [f"after-{i}" for i in range(50)]
