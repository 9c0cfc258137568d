"""One `pinmq node` for the STOMP benchmark: harness start-up, queue settings for its queues."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.nodes import running_node

from stomp_load.activemq import Running
from stomp_load.ready import wait_stomp

START_TIMEOUT_S = 30.0


@contextmanager
def running_pinmq(
    workdir: Path, pattern: str, consumers_before_dispatch: int, store: str = "auto"
) -> Iterator[Running]:
    """A node whose auto-created queues matching `pattern` wait for N consumers before dispatch;
    `store`: its store.format."""
    settings = {"default-consumers-before-dispatch": consumers_before_dispatch}
    extra = {
        "address-settings": {"#": {}, pattern: settings},
        "log": {"format": "json", "level": "warning"},
        "store": {"format": store},
    }
    t0 = time.monotonic()
    with running_node(workdir, extra) as node:
        host, port = node.listen["stomp"].rsplit(":", 1)
        wait_stomp(host, int(port), node.proc, node.log_path, START_TIMEOUT_S, "pinmq node")
        text = (
            f"pinmq node, listen.stomp {node.listen['stomp']}, address-settings {pattern!r}: "
            f"default-consumers-before-dispatch {consumers_before_dispatch} "
            "(other queue settings default: group-mode sticky, group-buckets -1, "
            f"group-rebalance false), log level warning, store.format {store}"
        )
        yield Running(host, int(port), node.pid, text, time.monotonic() - t0)
