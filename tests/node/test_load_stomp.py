"""`pinmq load --protocol stomp` against a real node: STOMP clients that audit their side of
the history, and carry on over a crash and restart of the node with a history `pinmq check`
finds clean (a send in doubt goes again, with its duplicate id, as with gRPC)."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PINMQ, NodeProcess, cli, unique
from drill_parts import clean_check
from ports import reserve_port

PROGRESS = re.compile(r"^\s+\d+ s  sent (\d+)  confirmed (\d+)  received \d+  acked (\d+)")
SUMMARY = re.compile(r"load done in [\d.]+ s: (\d+) confirmed \(\d+ msg/s\), (\d+) acked, (\d+) e")
WAIT_S = 90.0


def progress(load: subprocess.Popen[str], until: int) -> int:
    """Read progress lines until `until` messages are confirmed; the last confirmed count."""
    assert load.stdout is not None
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        line = load.stdout.readline()
        found = PROGRESS.match(line)
        assert found, f"not a progress line: {line!r}"
        if int(found.group(2)) >= until:
            return int(found.group(2))
    raise AssertionError(f"fewer than {until} messages confirmed in {WAIT_S:.0f} s")


@pytest.mark.slow  # a node crash and restart, then a Spark check
async def test_a_stomp_load_goes_on_over_a_node_crash_and_its_history_is_clean(
    tmp_path: Path,
) -> None:
    (tmp_path / "node").mkdir()
    node = NodeProcess(tmp_path / "node", {"audit": {"enabled": True, "flush-ms": 20}})
    history = tmp_path / "node" / "data" / "audit"
    node.start()
    load = None
    try:
        load = subprocess.Popen(
            [*PINMQ, "load", "--protocol", "stomp", "--url", f"127.0.0.1:{node.stomp_port}",
             "--queue", "orders", "--groups", "6", "--producers", "2", "--consumers", "2",
             "--rate", "60", "--duration", "0", "--audit", str(history / "clients")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        before = progress(load, until=30)
        node.stop(signal.SIGKILL)
        node.start()
        progress(load, until=before + 30)  # the clients came back to the restarted node
        load.send_signal(signal.SIGINT)
        out, err = load.communicate(timeout=90)
    finally:
        if load is not None and load.poll() is None:  # the test failed first: no process left
            load.kill()
            print("the load's stderr:", load.communicate()[1], sep="\n")
        node.stop()
    assert load.returncode == 0, err
    assert "pinmq: moved to 127.0.0.1" in err
    summary = SUMMARY.search(out)
    assert summary is not None, out
    confirmed, acked, _ = map(int, summary.groups())
    assert 0 < confirmed == acked
    stats = await clean_check(history, tmp_path / "report")
    assert stats["events"]["client_sent"] == confirmed
    assert stats["events"]["client_acked"] >= confirmed


def test_a_timed_stomp_load_acks_all_it_confirmed(shared_node: NodeProcess) -> None:
    done = cli(
        "load", "--protocol", "stomp", "--url", f"127.0.0.1:{shared_node.stomp_port}",
        "--queue", unique(), "--groups", "4", "--rate", "40", "--duration", "3",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = SUMMARY.search(done.stdout)
    assert summary is not None, done.stdout
    confirmed, acked, errors = map(int, summary.groups())
    assert 0 < confirmed == acked and errors == 0


def test_a_stomp_load_to_no_node_fails_at_once_naming_the_address() -> None:
    address = f"127.0.0.1:{reserve_port()}"
    done = cli("load", "--protocol", "stomp", "--url", address, "--queue", "q", "--duration", "5")
    assert done.returncode == 1
    assert done.stderr.startswith(f"pinmq: error: no node of {address} answered: {address}: ")
