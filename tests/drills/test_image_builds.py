"""Two image builds at once on one engine, as two container-test workers start theirs: both
must succeed. Unserialised, one build's closing prune and the other's tagging raced on the
same new image ("failed to get digest ... no such file or directory") and both failed, with
every container drill after them (a CI run). deploy/build-image.sh takes a lock per engine.

A copy of this checkout with a file of its own, so that the image's last layer is new to
the engine (a build all from docker's cache never raced), built twice at once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from compose_nodes import REPO, require_engine

# two builds of a changed tree, about a minute
pytestmark = [pytest.mark.slow, pytest.mark.containers]

LEFT_OUT = (".git", ".venv", ".bench", "data", "run", "secrets", "build", "*.egg-info")


def test_two_builds_of_a_changed_tree_at_once_both_succeed(tmp_path: Path) -> None:
    require_engine()
    tree = tmp_path / "checkout"
    shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(*LEFT_OUT, "__pycache__"))
    marker = uuid.uuid4().hex
    (tree / "broker" / "build_marker.py").write_text(f'"""A test build."""\nID = "{marker}"\n')
    tag = f"pinmq-build-race:{marker[:12]}"

    def build(_: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(tree / "deploy" / "build-image.sh"), sys.executable],
            env={**os.environ, "PINMQ_IMAGE": tag},
            capture_output=True,
            text=True,
            timeout=900,
        )

    try:
        with ThreadPoolExecutor(2) as pool:
            done = list(pool.map(build, range(2)))
        for one in done:
            assert one.returncode == 0, one.stdout + one.stderr
        found = subprocess.run(
            ["docker", "run", "--rm", "--entrypoint", "python3", tag, "-c",
             "import broker.build_marker as m; print(m.ID)"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert found.stdout.strip() == marker, found.stderr
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)
