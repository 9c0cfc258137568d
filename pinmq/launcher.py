"""`pinmq up` / `pinmq down`: run a set of nodes as background processes on this machine.

Each node gets a pid file and a log file in the run directory, so `down` finds exactly the
processes `up` started, and a second `up` refuses to start a node that is still running.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console
from rich.table import Table

from broker import channels
from broker.config import NodeConfig
from broker.config_file import load_config

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _healthy(cfg: NodeConfig) -> bool:
    """The node's gRPC health service says SERVING (over TLS, as the node itself, if it has
    tls: its certificate is one a node with client-auth required accepts)."""
    with channels.dial_blocking(cfg.listen.client, cfg.tls_files) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1.0
            )
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _started(cfg: NodeConfig) -> bool:
    """Serving clients; an ha backup, which serves none while passive: its HTTP answers."""
    if cfg.ha is not None and cfg.ha.role == "backup":
        tls = cfg.tls_files
        scheme, context = ("https", tls.client_context()) if tls is not None else ("http", None)
        try:
            url = f"{scheme}://{cfg.listen.http}/healthz"
            with urllib.request.urlopen(url, timeout=1.0, context=context):
                return True
        except OSError:
            return False
    return _healthy(cfg)


def _tail(log: Path, lines: int = 5) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def up(
    config_paths: list[str], run_dir: Path, console: Console, audit_dir: Path | None = None
) -> int:
    """Start every node that is not running yet; wait until all are healthy. `audit_dir`:
    where every node's audit log goes, whatever its config says (an overlay in `run_dir`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    overlays: list[Path] = []
    if audit_dir is not None:
        overlay = run_dir / "audit-dir.yaml"
        overlay.write_text(json.dumps({"audit": {"dir": str(audit_dir.resolve())}}) + "\n")
        overlays.append(overlay)
    configs = [(Path(p), load_config(p, *overlays)) for p in config_paths]
    if clash := _clashes([cfg for _, cfg in configs]):
        console.print(f"pinmq: error: {clash}", markup=False)
        return 2
    started: dict[str, subprocess.Popen[bytes]] = {}
    for path, cfg in configs:
        node_id = cfg.node.id
        pid_file = run_dir / f"{node_id}.pid"
        if (pid := _pid(pid_file)) is not None:
            console.print(f"{node_id}: already running (pid {pid})")
            continue
        log = (run_dir / f"{node_id}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "pinmq.cli", "node", "--config", str(path)]
            + [arg for o in overlays for arg in ("--config", str(o))],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in the shell that ran `up` leaves the nodes alone
        )
        pid_file.write_text(f"{proc.pid}\n")
        started[node_id] = proc
    deadline = time.monotonic() + START_TIMEOUT_S
    waiting = {cfg.node.id: cfg for _, cfg in configs}
    while waiting and time.monotonic() < deadline:
        for node_id, cfg in list(waiting.items()):
            proc = started.get(node_id)
            if proc is not None and proc.poll() is not None:
                console.print(f"{node_id}: exited with {proc.returncode} while starting:")
                console.print(_tail(run_dir / f"{node_id}.log"), markup=False)
                down(run_dir, console, quiet=True)
                return 1
            if _started(cfg):
                del waiting[node_id]
        time.sleep(0.2)
    if waiting:
        console.print(f"not healthy after {START_TIMEOUT_S:.0f} s: {', '.join(sorted(waiting))}")
        return 1
    _summary([cfg for _, cfg in configs], run_dir, console)
    return 0


def _clashes(configs: list[NodeConfig]) -> str | None:
    """Two nodes of one machine cannot share an id, a data dir or a listen address."""
    seen: dict[str, str] = {}
    for cfg in configs:
        owned = [f"node id {cfg.node.id}", f"data-dir {cfg.node.data_dir}"]
        served = [cfg.listen.client, cfg.listen.stomp, cfg.listen.http] + (
            [cfg.listen.cluster] if cfg.cluster else []
        )
        owned += [f"address {a}" for a in served]
        for thing in owned:
            if thing in seen:
                return f"{seen[thing]} and {cfg.node.id} both use {thing}"
            seen[thing] = cfg.node.id
    return None


def _summary(configs: list[NodeConfig], run_dir: Path, console: Console) -> None:
    table = Table(title="pinmq nodes")
    for column in ("node", "client (gRPC)", "STOMP", "HTTP", "cluster", "grouping handler", "log"):
        table.add_column(column)
    for cfg in configs:
        handler = cfg.grouping_handler.type if cfg.grouping_handler else "-"
        if cfg.ha is not None:
            handler += f" ({cfg.ha.role})"
        cluster = cfg.cluster_address if cfg.cluster else "-"
        log = str(run_dir / f"{cfg.node.id}.log")
        listen = cfg.listen
        table.add_row(cfg.node.id, listen.client, listen.stomp, listen.http, cluster, handler, log)
    console.print(table)
    # Consumed where it was sent: with no consumer anywhere, a new group binds to the node it
    # was sent through, and its messages never move to another node's consumer.
    first = configs[0].listen.client
    console.print(
        f"try: {_client_settings(configs[0])}"
        f"pinmq send orders --url {first} --group g1 --count 5 --body hi && "
        f"pinmq consume orders --url {first} --count 5 --json",
        markup=False,
    )


def _client_settings(cfg: NodeConfig) -> str:
    """What the try line starts with for a node with tls: `source DIR/client.env && ` when the
    CA's directory has one (`make secrets` writes it: the CA, a user and its password for the
    CLI), else `export PINMQ_TLS_CA=CA && ` (a node with security needs a user too: --user and
    --password-file, or $PINMQ_USER and $PINMQ_PASSWORD)."""
    if cfg.tls is None:
        return ""
    env_file = cfg.tls.ca.parent / "client.env"
    if env_file.is_file():
        return f"source {shlex.quote(str(env_file))} && "
    return f"export PINMQ_TLS_CA={shlex.quote(str(cfg.tls.ca))} && "


def down(run_dir: Path, console: Console, quiet: bool = False) -> int:
    """Stop every node with a pid file in the run directory: SIGTERM, then SIGKILL."""
    pid_files = sorted(run_dir.glob("*.pid")) if run_dir.is_dir() else []
    pids = {f: _pid(f) for f in pid_files}
    for pid in pids.values():
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for pid_file, pid in pids.items():
        while pid is not None and _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)
        pid_file.unlink(missing_ok=True)
        if not quiet:
            console.print(f"{pid_file.stem}: {'stopped' if pid else 'was not running'}")
    if not pid_files and not quiet:
        console.print(f"no nodes running from {run_dir}")
    return 0
