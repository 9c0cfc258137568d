"""Shared fixtures: real `pinmq node` processes on free loopback ports with temporary data dirs."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

START_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unique(prefix: str = "q") -> str:
    """A queue/address/group name no other test uses (tests share one node)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def node_command(config: Path) -> list[str]:
    return [sys.executable, "-m", "broker.cli", "node", "--config", str(config)]


def cli(*args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `pinmq ARGS...` as a subprocess and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class NodeProcess:
    """A node process started from a YAML config; restartable on the same data dir."""

    def __init__(self, workdir: Path, extra: dict[str, Any] | None = None) -> None:
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        self.data_dir = workdir / "data"
        self.config_path = workdir / "node.yaml"
        self.log_path = workdir / "node.log"
        config: dict[str, Any] = {
            "node": {"id": f"test-{self.port}", "data-dir": str(self.data_dir)},
            "listen": {"client": self.url, "stomp": f"127.0.0.1:{free_port()}"},
            "log": {"format": "json", "level": "info"},
        }
        for key, value in (extra or {}).items():
            config[key] = {**config.get(key, {}), **value}
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def store_path(self) -> Path:
        return self.data_dir / "store.db"

    def start(self, wait: bool = True) -> NodeProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(node_command(self.config_path), stdout=log, stderr=log)
        log.close()
        if wait:
            self.wait_serving()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_serving(self) -> None:
        """Poll the standard gRPC health service until the node reports SERVING."""
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        with grpc.insecure_channel(self.url) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"node exited with {self.proc.returncode}:\n{self.log()}")
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.05)
        raise RuntimeError(f"node not serving after {START_TIMEOUT_S}s:\n{self.log()}")

    def wait_exit(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Signal the node and wait for it; returns its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def node_factory(tmp_path: Path) -> Iterator[Callable[..., NodeProcess]]:
    """Start nodes with config overrides, e.g. `node_factory({"limits": {...}})`."""
    nodes: list[NodeProcess] = []

    def make(extra: dict[str, Any] | None = None, start: bool = True) -> NodeProcess:
        workdir = tmp_path / f"node{len(nodes)}"
        workdir.mkdir()
        node = NodeProcess(workdir, extra)
        nodes.append(node)
        return node.start() if start else node

    yield make
    for node in nodes:
        node.kill()


@pytest.fixture(scope="session")
def shared_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One node for the tests that only need isolation by queue name."""
    node = NodeProcess(tmp_path_factory.mktemp("shared-node")).start()
    yield node
    node.kill()


@pytest.fixture
def url(shared_node: NodeProcess) -> str:
    return shared_node.url
