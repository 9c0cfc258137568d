"""A healthy start and a clean stop log nothing at warning or above: `make up-local` (`pinmq up`
of deploy/node1.yaml, node1-backup.yaml, node2.yaml, node3.yaml) and `pinmq down`, with the
configs rewritten to temporary data dirs and reserved ports. States that are normal while the
pair elects or a peer stops are logged at info; the pair is elected once, at epoch 1. The
nodes keep their TLS and security (the development secrets of `make secrets`, by absolute
path), so the CLI and HTTP calls come over TLS, as the user admin."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, cli, get
from deploy_access import ClientAccess, dev_access
from log_levels import loud, stopped
from ports import reserve_port
from waiting import wait

NODES = ("node1", "node1-backup", "node2", "node3")

pytestmark = pytest.mark.slow


def deploy_configs(tmp_path: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """deploy/<node>.yaml with every listen address on a reserved port (connectors and the
    backup's ha.primary following), data and audit in `tmp_path`, logs as JSON, the secrets/
    files by absolute path (`make up-local` runs the nodes from the repository; pytest may
    not)."""
    configs = {n: yaml.safe_load((REPO / "deploy" / f"{n}.yaml").read_text()) for n in NODES}
    moved = {
        address: f"127.0.0.1:{reserve_port()}"
        for config in configs.values()
        for address in config["listen"].values()
    }
    written = {}
    for name, config in configs.items():
        config["node"]["data-dir"] = str(tmp_path / "data" / name)
        config["audit"]["dir"] = str(tmp_path / "audit")
        config["listen"] = {kind: moved[a] for kind, a in config["listen"].items()}
        config["cluster"]["connectors"] = [moved[a] for a in config["cluster"]["connectors"]]
        if config.get("ha", {}).get("primary"):
            config["ha"]["primary"] = moved[config["ha"]["primary"]]
        config["log"]["format"] = "json"
        tls, security = config["tls"], config["security"]  # relative to the repository
        for key in ("cert", "key", "ca"):
            tls[key] = str(REPO / tls[key])
        security["users-file"] = str(REPO / security["users-file"])
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        written[name] = (path, config)
    return written


def pair_as_heard(config: dict[str, Any], access: ClientAccess) -> dict[str, Any] | None:
    """The pair as a node knows it (`pinmq status --json`): from its voter's record."""
    status = cli("status", "--json", "--url", config["listen"]["client"], *access.cli_args())
    if status.returncode != 0:
        return None
    pairs = json.loads(status.stdout)["ha"]
    return pairs[0] if pairs else None


def test_make_up_local_and_down_log_nothing_at_warning_or_above(tmp_path: Path) -> None:
    access = dev_access()
    configs = deploy_configs(tmp_path)
    run = tmp_path / "run"
    started = cli("up", *(str(path) for path, _ in configs.values()), "--run-dir", str(run))
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        # The backup in sync as every process of the cluster knows it: the voters' records
        # and the backup's own view (what `make up` users then rely on for a failover).
        for voter in ("node2", "node3"):
            wait(
                f"{voter} hears the backup is in sync",
                lambda v=voter: (pair_as_heard(configs[v][1], access) or {}).get("backup_in_sync"),
            )
        backup = configs["node1-backup"][1]["listen"]["http"]
        wait(
            "the backup knows it is in sync",
            lambda: get(backup, "/readyz", access.tls)[1]["ha"]["in_sync"],
        )
        # The backup serves no clients: the others say what they know.
        pairs = [pair_as_heard(configs[name][1], access) for name in ("node1", "node2", "node3")]
    finally:
        down = cli("down", "--run-dir", str(run))
    assert down.returncode == 0, down.stdout + down.stderr
    for pair in pairs:
        assert pair is not None
        assert (pair["active"], pair["epoch"], pair["backup"], pair["backup_in_sync"]) == (
            "node1",
            1,
            "node1-backup",
            True,
        )
    logs = {n: (run / f"{n}.log").read_text(errors="replace").splitlines() for n in NODES}
    assert all(stopped(lines) for lines in logs.values()), {n: x[-5:] for n, x in logs.items()}
    loud_lines = {n: found for n, lines in logs.items() if (found := loud(lines))}
    assert not loud_lines, json.dumps(loud_lines, indent=1)
