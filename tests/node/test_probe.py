"""The container health check (`python -m pinmq.probe`): ready nodes and passive backups that
hold a full copy are healthy, anything else is not, with the reason on one line. Against a
real node's HTTP endpoint, and on the shapes /readyz answers with."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from conftest import NodeProcess
from ports import reserve_port

from pinmq.probe import verdict


def probe(address: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pinmq.probe", address], capture_output=True, text=True, timeout=30
    )


def test_a_ready_node_is_healthy_and_a_silent_one_is_not(
    node_factory: Callable[..., NodeProcess],
) -> None:
    node: NodeProcess = node_factory()
    done = probe(node.http)
    assert (done.returncode, done.stdout.strip()) == (0, "healthy: ready")
    nobody = f"127.0.0.1:{reserve_port()}"
    done = probe(nobody)
    assert done.returncode == 1 and done.stdout.startswith(f"unhealthy: {nobody} does not answer")


def test_a_passive_backup_is_healthy_only_with_a_full_copy() -> None:
    following = {"replication": "following", "in_sync": True, "active": "node1"}
    assert verdict(503, {"ha": following}) == (True, "passive backup in sync with node1")
    catching_up = {"ha": {"replication": "receiving snapshot", "in_sync": False},
                   "reasons": ["passive: node1 holds the node"]}  # fmt: skip
    assert verdict(503, catching_up) == (False, "passive: node1 holds the node")
    assert verdict(503, {}) == (False, "/readyz answered 503")
