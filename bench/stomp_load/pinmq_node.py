"""Run one `pinmq node` with its STOMP listener on a free loopback port and a private data dir."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from stomp_load.activemq import Running
from stomp_load.common import die_with_parent, free_port, stop, wait_stomp

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0


@contextmanager
def running_pinmq(workdir: Path, pattern: str, consumers_before_dispatch: int) -> Iterator[Running]:
    """A node whose auto-created queues matching `pattern` wait for N consumers before dispatch."""
    port = free_port()
    settings = {"default-consumers-before-dispatch": consumers_before_dispatch}
    config = {
        "node": {"id": "stompbench", "data-dir": str(workdir / "data")},
        "listen": {
            "client": f"127.0.0.1:{free_port()}",
            "stomp": f"127.0.0.1:{port}",
            "cluster": f"127.0.0.1:{free_port()}",
            "http": f"127.0.0.1:{free_port()}",
        },
        "address-settings": {"#": {}, pattern: settings},
        "log": {"format": "json", "level": "warning"},
    }
    path = workdir / "node.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    log_path = workdir / "node.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pinmq.cli", "node", "--config", str(path)],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # Ctrl-C reaches only us; we stop the node ourselves
            preexec_fn=die_with_parent,
        )
    try:
        took = wait_stomp("127.0.0.1", port, proc, log_path, START_TIMEOUT_S, "pinmq node")
        text = (
            f"pinmq node, listen.stomp 127.0.0.1:{port}, address-settings {pattern!r}: "
            f"default-consumers-before-dispatch {consumers_before_dispatch} "
            "(other queue settings default: group-mode sticky, group-buckets -1, "
            "group-rebalance false), log level warning"
        )
        yield Running("127.0.0.1", port, proc.pid, text, took)
    finally:
        stop(proc, grace=15.0)
