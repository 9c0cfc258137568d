"""`make check MASTER=spark://spark-master:7077` on the compose file's Spark cluster (`make
up-spark`: a master and two workers from the pinmq-spark image) gives the verdict `pinmq
check` gives on local[*]: the executors in their containers read the history themselves.

Run by `make test-spark-cluster` (which builds the image when missing), not by `make test`:
the cluster runs in a compose project of its own, removed at the end, whatever happened."""

from __future__ import annotations

import io
import json
import os
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from ports import reserve_port
from waiting import wait

from pipeline.cli import run_check
from pipeline.synth import Inject, generate

pytestmark = [pytest.mark.spark_cluster, pytest.mark.slow]

SERVICES = ("spark-master", "spark-worker-1", "spark-worker-2")
START_S = 180.0


def compose(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "compose", "--profile", "spark", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=START_S,
    )  # fmt: skip


def alive_workers(ui_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as reply:
        return int(json.load(reply)["aliveworkers"])


def test_the_compose_spark_cluster_gives_the_local_verdict(spark: Any, tmp_path: Path) -> None:
    history = tmp_path / "audit"
    generate(history, messages=5000, groups=20, failover=True, inject=Inject(duplicates=2, order=1))
    assert run_check(history, spark=spark, report=tmp_path / "local", out=io.StringIO()) == 1
    local = json.loads((tmp_path / "local" / "summary.json").read_text())

    ui_port = reserve_port()
    env = {
        **os.environ,
        "COMPOSE_PROJECT_NAME": f"pinmq-spark-test-{os.getpid()}",
        "PINMQ_AUDIT_DIR": str(history),
        "PINMQ_SPARK_UI_PORT": str(ui_port),
        "DOCKER_CONFIG": str(REPO / ".venv" / "docker"),
    }
    try:
        up = compose(env, "up", "-d", "--wait", *SERVICES)
        assert up.returncode == 0, up.stderr
        wait("both workers registered", lambda: alive_workers(ui_port) == 2, START_S,
             ignoring=(OSError,))  # fmt: skip
        done = subprocess.run(
            ["make", "--no-print-directory", "check", "MASTER=spark://spark-master:7077",
             f"CHECK_REPORT={tmp_path / 'cluster'}"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    finally:
        down = compose(env, "down", "-v", "--remove-orphans")
    assert down.returncode == 0, down.stderr
    # make fails (2) as its check recipe did: pinmq check's 1, violations found.
    assert done.returncode == 2 and "check] Error 1" in done.stderr, done.stdout + done.stderr
    assert "verdict: VIOLATIONS (3)" in done.stdout
    assert f"its /var/lib/pinmq/check is {tmp_path / 'cluster'}" in done.stdout
    cluster = json.loads((tmp_path / "cluster" / "summary.json").read_text())
    assert cluster["violations"] == local["violations"]
    assert cluster["violations"]["duplicates"] == 2 and cluster["violations"]["order"] == 1
    assert cluster["input"]["lines"] == local["input"]["lines"] > 0
    assert cluster["input"]["files"] == local["input"]["files"]
    assert cluster["stats"]["events"] == local["stats"]["events"]
