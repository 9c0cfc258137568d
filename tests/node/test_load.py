"""`pinmq load` against a real node, as a user runs it: its progress and summary, a clean stop
on Ctrl-C with every audit log whole, and a history `pinmq check` finds clean."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import PINMQ, NodeProcess, cli, unique
from drill_parts import clean_check

from pinmq.load import Tally, _summary

PROGRESS = re.compile(r"^\s+\d+ s  sent (\d+)  confirmed (\d+)  received \d+  acked (\d+)", re.M)
SUMMARY = re.compile(r"load done in [\d.]+ s: (\d+) confirmed \(\d+ msg/s\), (\d+) acked, 0 errors")


def test_a_timed_load_reports_each_second_and_acks_all_it_confirmed(url: str) -> None:
    done = cli(
        "load", "--url", url, "--queue", unique(), "--groups", "4", "--rate", "40",
        "--duration", "3",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(PROGRESS.findall(done.stdout)) >= 3
    summary = SUMMARY.search(done.stdout)
    assert summary is not None, done.stdout
    confirmed, acked = map(int, summary.groups())
    assert 0 < confirmed == acked


def test_bad_arguments_are_refused_with_nothing_sent(url: str) -> None:
    for bad in (["--rate", "0"], ["--groups", "0"], ["--duration", "-1"]):
        done = cli("load", "--url", url, "--queue", "q", *bad)
        assert done.returncode == 2
        assert bad[0] in done.stderr


@pytest.mark.slow
async def test_ctrl_c_ends_the_load_cleanly_with_a_history_pinmq_check_finds_clean(
    tmp_path: Path,
) -> None:
    (tmp_path / "node").mkdir()
    node = NodeProcess(tmp_path / "node", {"audit": {"enabled": True, "flush-ms": 20}})
    history = tmp_path / "node" / "data" / "audit"  # the node's, and the clients' within it
    node.start()
    load = None
    try:
        load = subprocess.Popen(
            [*PINMQ, "load", "--url", node.url, "--queue", "orders", "--groups", "6",
             "--producers", "3", "--consumers", "2", "--rate", "60", "--duration", "0",
             "--audit", str(history / "clients")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert load.stdout is not None
        for _ in range(2):  # a line a second: the load runs
            assert PROGRESS.match(load.stdout.readline())
        load.send_signal(signal.SIGINT)
        out, err = load.communicate(timeout=60)
    finally:
        if load is not None and load.poll() is None:  # the test failed first: no process left
            load.kill()
            load.communicate()
        node.stop()
    assert load.returncode == 0, err
    summary = SUMMARY.search(out)
    assert summary is not None, out
    confirmed = int(summary.group(1))
    stats = await clean_check(history, tmp_path / "report")
    assert stats["events"]["client_sent"] == confirmed


def test_an_ack_of_unknown_outcome_is_told_apart_and_not_waited_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An ack whose stream ended before its receipt may have been committed: the load cannot
    wait for a redelivery that may never come, so it says so and leaves it to the check; a
    confirmed message neither acked nor in doubt still fails the load."""
    tally = Tally(confirmed={b"g0:0:", b"g0:1:", b"g1:0:"}, acked={b"g0:0:"}, unsure={b"g0:1:"})
    assert tally.missing() == {b"g1:0:"}
    assert _summary(tally, 1.0) == 1
    err = capsys.readouterr().err
    assert "1 acks of unknown outcome" in err and "1 confirmed messages not acked" in err
    tally.acked.add(b"g1:0:")
    assert _summary(tally, 1.0) == 0
    assert "not acked" not in capsys.readouterr().err
