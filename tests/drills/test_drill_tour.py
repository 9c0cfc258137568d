"""The README's "Drill it yourself" tour, run as written against `make up`'s containers: an
audited `pinmq load` through node1's pair, `docker compose kill node1`, node2 paused and
unpaused, the load stopped, then `make check` over the shared audit directory.

The tour runs in a checkout of its own (the Makefile, the compose files and deploy/ copied;
the venv and secrets/ linked), so its run/audit and run/check are the test's, and under a
compose project of its own with host ports of its own: the only change to the README's lines
is the pair's ports, swapped for the reserved ones. The verdict must be clean, the load must
have had every confirmed message acked, and the report must name the failover.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from compose_nodes import IMAGE, REPO, SERVICES, build_image
from deploy_access import SECRETS, dev_access
from ports import reserve_port
from readme_blocks import readme_script

# an image build, a cluster, a minute of load and a Spark check
pytestmark = [pytest.mark.slow, pytest.mark.containers]

KINDS = ("client", "stomp", "http")
TOUR_TIMEOUT_S = 900
# The checkout the tour needs: make's targets, the cluster's files and what they read.
COPIED = ("Makefile", "pyproject.toml", "docker-compose.yml", "docker-compose.ha-all.yml")


def checkout(work: Path) -> Path:
    """A checkout for the tour: copies of what `make up` reads (mtimes kept: make sees the
    venv up to date), the venv and secrets/ as links."""
    work.mkdir()
    for name in COPIED:
        shutil.copy2(REPO / name, work / name)
    shutil.copytree(REPO / "deploy", work / "deploy")
    (work / ".venv").symlink_to(REPO / ".venv")
    (work / "secrets").symlink_to(SECRETS)
    return work


def tour_env(work: Path, image: str) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """The user's environment with a compose project, an image and host ports of the test's."""
    ports = {name: {kind: reserve_port() for kind in KINDS} for name in SERVICES}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PINMQ_", "DOCKER_"))}
    env.update(
        COMPOSE_PROJECT_NAME=f"pinmq-tour-{os.getpid()}-{reserve_port()}",
        PINMQ_IMAGE=image,
        PATH=f"{work / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
    )
    for name, kinds in ports.items():
        for kind, port in kinds.items():
            env[f"PINMQ_{name.upper().replace('-', '_')}_{kind.upper()}_PORT"] = str(port)
    return env, ports


def compose(work: Path, env: dict[str, str], *args: str) -> str:
    """`docker compose ARGS` on the tour's project, as the tour runs it; its output."""
    done = subprocess.run(
        ["docker", "compose", *args],
        cwd=work,
        env={**env, "DOCKER_CONFIG": str(work / ".venv" / "docker")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.stdout + done.stderr


def test_the_drill_it_yourself_tour_ends_in_a_clean_check_that_names_the_failover(
    tmp_path: Path,
) -> None:
    image = build_image(IMAGE)
    dev_access()  # secrets/ made before compose mounts it
    work = checkout(tmp_path / "checkout")
    env, ports = tour_env(work, image)
    script = readme_script("Drill it yourself")
    pair = "127.0.0.1:7601,127.0.0.1:7611"
    assert pair in script, "the tour no longer loads node1's pair at its default ports"
    ours = f"127.0.0.1:{ports['node1']['client']},127.0.0.1:{ports['node1-backup']['client']}"
    try:
        done = subprocess.run(
            ["bash", "-c", "set -e\n" + script.replace(pair, ours)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=TOUR_TIMEOUT_S,
        )
    finally:
        logs = compose(work, env, "logs", "--no-color", "-t")
        (tmp_path / "containers.log").write_text(logs)  # kept for a failure's post-mortem
        compose(work, env, "down", "--volumes")
    told = f"exit {done.returncode}\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    assert done.returncode == 0, told
    [summary] = [line for line in done.stdout.splitlines() if line.startswith("load done in ")]
    confirmed, acked = (
        int(re.search(rf"(\d+) {word}", summary).group(1))  # type: ignore[union-attr]
        for word in ("confirmed", "acked")
    )
    # Acks in flight when node1 died have an unknown outcome: the check judges those.
    doubt = re.search(r"(\d+) acks of unknown outcome", done.stderr)
    unsure = int(doubt.group(1)) if doubt else 0
    assert confirmed > 1000 and acked + unsure >= confirmed, summary
    assert "verdict: CLEAN" in done.stdout, told
    report = work / "run" / "check" / "report.html"
    assert f"report: {report.relative_to(work)}" in done.stdout, told
    stats = json.loads((work / "run" / "check" / "summary.json").read_text())["stats"]
    writers = {p.name.rsplit("-", 2)[0] for p in (work / "run" / "audit").rglob("*.jsonl")}
    # Every node's log in the one directory (node1-backup writes as node1, the node it serves).
    assert {"node1", "node2", "node3"} <= writers, writers
    assert any(w.startswith("load-") for w in writers), writers
    moments = [m["what"] for m in stats["failovers"]]
    assert any(m.startswith("node node1 stopped (back after ") for m in moments), moments
    assert "node node1 stopped" in report.read_text()
    # The cluster is down, its segments final (the tour's check may have seen them before the
    # nodes' last lines: then the first check here converts them again); the second `make
    # check` reads the events the first kept in run/check/cache (README: "a second make check").
    for allowed in (("converted", "reused"), ("reused",)):
        again = subprocess.run(["make", "check"], cwd=work, env=env, capture_output=True, text=True)
        assert again.returncode == 0 and "verdict: CLEAN" in again.stdout, again.stdout[-3000:]
        checked = json.loads((work / "run" / "check" / "summary.json").read_text())
        assert checked["input"]["cache"] in allowed, checked["input"]
