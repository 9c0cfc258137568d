"""`pinmq top`: the view built from two readings of a node's metrics (pure), then the command
against real node processes: a stuck group and a stalled consumer named, a node that cannot
be reached, one that stops answering and comes back, Ctrl-C, and security's `manage`."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from conftest import PINMQ, NodeProcess, cli, scrape, unique
from waiting import until, wait

from broker.client import Client, Forbidden
from broker.users import UserEntry, hash_password, write_users
from pinmq.top import GroupRow, Reading, StalledRow, build

AT = datetime(2024, 1, 1)


def reading(taken: float, *lines: str) -> Reading:
    """A reading of the Prometheus text `lines` (`name{labels} value`), node n1's."""
    return Reading.parse("\n".join(lines) + "\n", taken, AT)


def queue(name: str, enqueued: float, acked: float, waits: tuple[float, ...] = ()) -> list[str]:
    """A queue's series: its totals, and the cumulative counts of its wait histogram (by
    bucket, from the first; none without `waits`)."""
    labels = f'node="n1",queue="{name}"'
    bounds = ("0.001", "0.005", "0.025", "0.1", "0.5", "+Inf")
    return [
        f"pinmq_queue_pending_messages{{{labels}}} 3",
        f"pinmq_queue_in_flight_messages{{{labels}}} 1",
        f"pinmq_queue_enqueued_messages_total{{{labels}}} {enqueued}",
        f"pinmq_queue_acked_messages_total{{{labels}}} {acked}",
        *(
            f'pinmq_queue_enqueue_to_first_delivery_seconds_bucket{{{labels},le="{le}"}} {n}'
            for le, n in zip(bounds, waits, strict=False)
        ),
    ]


def test_rates_are_the_counters_growth_between_two_readings() -> None:
    before = reading(10.0, *queue("a", 100, 40), *queue("reset", 50, 50))
    after = reading(12.0, *queue("a", 130, 100), *queue("reset", 4, 2), *queue("new", 7, 0))
    rows = {q.queue: q for q in build(before, after, 5).queues}
    assert (rows["a"].in_per_s, rows["a"].acked_per_s) == (15.0, 30.0)
    assert (rows["a"].pending, rows["a"].in_flight) == (3, 1)
    # A node that restarted (counters went back) and a queue seen once: no rate yet.
    assert rows["reset"].in_per_s is rows["new"].in_per_s is None
    assert all(q.in_per_s is None for q in build(None, after, 5).queues)


def test_the_median_wait_is_the_bucket_that_holds_it_between_the_readings() -> None:
    before = reading(0.0, *queue("a", 0, 0, (0, 10, 10, 10, 10, 10)))
    # Since then: one message within 25 ms, four between 100 and 500 ms.
    after = reading(1.0, *queue("a", 0, 0, (0, 10, 11, 11, 15, 15)))
    assert build(before, after, 5).queues[0].wait_p50 == (0.1, 0.5)
    assert build(None, after, 5).queues[0].wait_p50 == (0.001, 0.005)  # since the start
    assert build(after, after, 5).queues[0].wait_p50 is None  # nothing new


def top_group(name: str, queue: str, group: str, value: float, owner: str = "") -> str:
    held = "true" if owner == "" else "false"
    return (
        f'{name}{{node="n1",queue="{queue}",group="{group}",owner="{owner}",held="{held}"}} {value}'
    )


def test_the_most_lagging_groups_of_every_queue_longest_waiting_first() -> None:
    backlog, age = "pinmq_top_group_backlog_messages", "pinmq_top_group_oldest_age_seconds"
    now = reading(
        0.0,
        top_group(backlog, "a", "big", 500, "c1"),
        top_group(backlog, "b", "old", 3, "c2"),
        top_group(backlog, "b", "small", 1, "c2"),
        top_group(age, "a", "big", 2.0, "c1"),
        top_group(age, "b", "old", 300.0, "c2"),
        top_group(age, "b", "held", 30.0),
        top_group(age, "b", "small", 1.0, "c2"),
    )
    assert build(None, now, 2).groups == [
        GroupRow("b", "old", "c2", False, 3, 300.0),
        GroupRow("b", "held", None, True, None, 30.0),
        GroupRow("a", "big", "c1", False, 500, 2.0),
    ]  # "small" is in neither top 2


def test_stalled_consumers_with_what_they_hold() -> None:
    now = reading(
        0.0,
        'pinmq_consumer_stalled{node="n1",queue="a",consumer="slow",consumer_id="c1"} 1',
        'pinmq_consumer_stalled{node="n1",queue="a",consumer="fine",consumer_id="c2"} 0',
        'pinmq_consumer_unacked_messages{node="n1",queue="a",consumer="slow",consumer_id="c1"} 4',
        'pinmq_consumer_unacked_messages{node="n1",queue="a",consumer="fine",consumer_id="c2"} 9',
        'pinmq_peer_linked{node="n1",peer="n2"} 1',
        'pinmq_peer_linked{node="n1",peer="n3"} 0',
    )
    view = build(None, now, 5)
    assert view.stalled == [StalledRow("a", "slow", "c1", 4)]
    assert (view.node, view.peers) == ("n1", (1, 2))


# ---- the command, against real nodes ----------------------------------------------------------


def rows(output: str, first: str) -> list[list[str]]:
    """The cells of the table rows whose first cell is `first`."""
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in output.splitlines()]
    return [row for row in cells if row and row[0] == first]


async def test_a_stuck_group_and_a_stalled_consumer_are_named(
    node_factory: Callable[..., NodeProcess],
) -> None:
    """A consumer takes one message of group `stuck` and never acks it: `top` names the
    queue, the group with its owner and backlog, and the consumer once it stalls."""
    settings = {"#": {"default-slow-consumer-threshold": 200}}
    node = node_factory({"address-settings": settings})
    name = unique("top")
    async with Client(node.url) as client:
        await client.producer(name, group_id="stuck").send_many(["s"] * 10)
        await client.producer(name, group_id="other").send("o")
        async with client.consumer(name, name="slowpoke", prefetch=1) as consumer:
            first = await consumer.receive(timeout=30)
            assert first is not None and first.group_id == "stuck"
            await until(
                "the consumer stalls",
                lambda: scrape(node.http).value("pinmq_consumer_stalled", queue=name) == 1,
            )
            top = await asyncio.to_thread(cli, "top", "--once", "--url", node.url)
            assert top.returncode == 0, top.stderr
            assert top.stdout.startswith(f"pinmq top: test-{node.port} at ")
            [row] = rows(top.stdout, name)
            assert row[1:5] == ["10", "1", "1", "1/1/0"]  # pending, in flight, consumers, groups
            [stuck] = rows(top.stdout, "stuck")
            assert stuck[1:5] == [name, "slowpoke", "no", "9"]  # queue, owner, held, backlog
            assert rows(top.stdout, "other")[0][1:5] == [name, "-", "no", "1"]
            [stalled] = rows(top.stdout, f"slowpoke ({consumer.consumer_id})")
            assert stalled[1:] == [name, "1"]


def test_an_unreachable_node_is_a_one_line_error() -> None:
    result = cli("top", "--once", "--url", "127.0.0.1:1")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "pinmq: error: cannot reach a pinmq node at 127.0.0.1:1 (connection refused or timed out)"
    )


# SIGINT as a terminal sends it, even when the tests run where it is ignored: set to its
# default, then exec'd (a preexec_fn runs Python between fork and exec, which can hang when
# other threads, gRPC's among them, held a lock at the fork: CI saw no first frame in 30 s).
WITH_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def test_a_node_that_stops_answering_is_shown_so_until_it_is_back_and_ctrl_c_ends_it(
    node_factory: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    node = node_factory()
    out = tmp_path / "top.out"

    def frames() -> list[str]:
        """The complete frames printed so far (each ends with a blank line)."""
        return out.read_text().split("\n\n")[:-1]

    command = [sys.executable, "-c", WITH_SIGINT, *PINMQ[1:], "top", "--every", "0.2"]
    command += ["--url", node.url]
    with out.open("w") as stdout:
        top = subprocess.Popen(
            command,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        wait("a first frame", frames)
        node.stop()
        stale = wait(
            "a frame saying the node stopped answering",
            lambda: next((f for f in frames() if "node stopped answering since" in f), None),
        )
        assert stale.startswith(f"pinmq top: test-{node.port}")  # the last view, kept
        node.start()
        wait(
            "a fresh frame after the node came back",
            lambda: "node stopped answering" not in frames()[-1],
        )
        top.send_signal(signal.SIGINT)
        _, err = top.communicate(timeout=20)
    finally:
        top.kill()
        top.wait()
    assert top.returncode == 0 and err == ""


@pytest.fixture
def secured(node_factory: Callable[..., NodeProcess], tmp_path: Path) -> NodeProcess:
    """A node with security on: `admin` may do everything, `app` only send."""
    users = tmp_path / "users.yaml"
    write_users(
        users,
        {name: UserEntry(hash_password(f"pw-{name}"), (name,)) for name in ("admin", "app")},
    )
    roles = {"#": {"send": ["app", "admin"], "manage": ["admin"], "browse": ["admin"]}}
    security = {"enabled": True, "users-file": str(users), "roles": roles}
    return node_factory({"security": security})


async def test_metrics_need_manage_on_every_address(secured: NodeProcess, tmp_path: Path) -> None:
    async with Client(secured.url, user="app", password="pw-app") as app:
        with pytest.raises(Forbidden, match="lacks permission 'manage'"):
            await app.metrics_text()
    async with Client(secured.url, user="admin", password="pw-admin") as admin:
        assert f'node="test-{secured.port}"' in await admin.metrics_text()
    for user in ("app", "admin"):
        (tmp_path / user).write_text(f"pw-{user}\n")
    args = ("top", "--once", "--url", secured.url, "--user")
    refused = cli(*args, "app", "--password-file", str(tmp_path / "app"))
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"pinmq: error: refused by {secured.url}: user 'app' lacks")
    assert "Traceback" not in refused.stderr
    allowed = cli(*args, "admin", "--password-file", str(tmp_path / "admin"))
    assert allowed.returncode == 0 and allowed.stdout.startswith("pinmq top:"), allowed.stderr
