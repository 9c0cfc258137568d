"""`pinmq up` starts nodes in the background and waits for health; `pinmq down` stops them."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import yaml
from conftest import cli
from ports import reserve_port

from broker.client import SyncClient


def _config(tmp_path: Path, node_id: str) -> tuple[Path, str]:
    url = f"127.0.0.1:{reserve_port()}"
    config = {
        "node": {"id": node_id, "data-dir": str(tmp_path / node_id)},
        "listen": {
            "client": url,
            "stomp": f"127.0.0.1:{reserve_port()}",
            "http": f"127.0.0.1:{reserve_port()}",
        },
    }
    path = tmp_path / f"{node_id}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, url


def _running(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def test_up_waits_for_health_and_down_stops_everything(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (a, url_a), (b, url_b) = _config(tmp_path, "la"), _config(tmp_path, "lb")
    started = cli("up", str(a), str(b), "--run-dir", str(run))
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert url_a in started.stdout and url_b in started.stdout
        for url in (url_a, url_b):  # healthy means serving: a send goes through at once
            with SyncClient(url) as client:
                client.send("up-check", b"x")
        again = cli("up", str(a), "--run-dir", str(run))
        assert again.returncode == 0 and "already running" in again.stdout
        pid_files = sorted(run.glob("*.pid"))
        assert [p.stem for p in pid_files] == ["la", "lb"]
    finally:
        stopped = cli("down", "--run-dir", str(run))
    assert stopped.returncode == 0
    assert not any(_running(p) for p in pid_files)
    assert not list(run.glob("*.pid"))


def test_up_audit_dir_moves_every_nodes_audit_log(tmp_path: Path) -> None:
    run, moved, configured = tmp_path / "run", tmp_path / "moved", tmp_path / "configured"
    path, url = _config(tmp_path, "au")
    config = yaml.safe_load(path.read_text())
    config["audit"] = {"enabled": True, "dir": str(configured)}
    path.write_text(yaml.safe_dump(config))
    started = cli("up", str(path), "--run-dir", str(run), "--audit-dir", str(moved))
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        with SyncClient(url) as client:
            client.send("audited", b"x")
    finally:
        assert cli("down", "--run-dir", str(run)).returncode == 0
    segments = list(moved.rglob("*.jsonl"))
    assert segments and all(p.name.startswith("au-") for p in segments)
    assert any(b'"kind":"sent"' in p.read_bytes() for p in segments)
    assert not configured.exists() or not list(configured.rglob("*.jsonl"))


@pytest.mark.slow
def test_up_reports_a_node_that_cannot_start(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (good, _), (bad, bad_url) = _config(tmp_path, "ok"), _config(tmp_path, "blocked")
    host, port = bad_url.split(":")
    with socket.socket() as squatter:  # another program holds the node's client port
        squatter.bind((host, int(port)))
        squatter.listen()
        result = cli("up", str(good), str(bad), "--run-dir", str(run))
    assert result.returncode == 1
    assert "blocked: exited with 1 while starting" in result.stdout
    assert not list(run.glob("*.pid")), "the nodes that did start are stopped again"


def test_up_refuses_nodes_that_share_an_address(tmp_path: Path) -> None:
    first, _ = _config(tmp_path, "one")
    twin = tmp_path / "twin.yaml"
    config = yaml.safe_load(first.read_text())
    config["node"] = {"id": "two", "data-dir": str(tmp_path / "two")}
    twin.write_text(yaml.safe_dump(config))
    result = cli("up", str(first), str(twin), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "one and two both use address" in result.stdout


def test_up_with_a_bad_config_names_it(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("node: {id: x, colour: blue}\n")
    result = cli("up", str(bad), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "broken.yaml: node: unknown key 'colour'" in result.stderr
