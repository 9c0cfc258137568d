"""kill -9 under load, restart: nothing acknowledged is lost, no acked one comes back, in order.

A real node runs on a temporary data dir. Load runs in a separate process (tests/crash_load.py)
that records, line by line and flushed, every send only after it was acknowledged and every
ack only after its receipt (the ack committed) arrived. Once enough has happened the node is
killed with SIGKILL, the load stops on its own, the node restarts on the same data dir and a
fresh consumer takes everything left. Then a second round of load and crash on the same store.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import TESTS, NodeProcess, unique

from broker.client import Client, Received

LOAD_SCRIPT = TESTS / "crash_load.py"
GROUPS = 20
ROUNDS = 2
SEQ_STEP = 1_000_000  # round r numbers its messages r * SEQ_STEP + 1, + 2, ... per group
KILL_AFTER_SENDS = 2000  # acknowledged sends before the kill ...
KILL_AFTER_RECEIPTS = 200  # ... and acks with a receipt
PAD = b"x" * 1000  # body bytes after "group:seq:", so commits carry some weight
HOLD = 30  # the load consumer always holds this many deliveries unacked
LOAD_TIMEOUT_S = 20.0  # bound on waiting for the load to get that far
DRAIN_WAIT_S = 10.0


@dataclass
class Record:
    """What the load process knows happened before the crash (see crash_load.py)."""

    attempted: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    sent: dict[int, tuple[str, int]] = field(default_factory=dict)  # send acknowledged
    delivered: dict[int, tuple[str, int]] = field(default_factory=dict)
    ack_sent: set[int] = field(default_factory=set)  # outcome unknown without a receipt
    receipted: set[int] = field(default_factory=set)  # the ack is committed


def read_record(path: Path) -> Record:
    rec = Record()
    text = path.read_text() if path.exists() else ""
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break  # a torn last line: what it would have said is unknown, so it says nothing
        kind, *rest = line.split()
        if kind == "T":
            rec.attempted[rest[0]].add(int(rest[1]))
        elif kind == "S":
            rec.sent[int(rest[0])] = (rest[1], int(rest[2]))
        elif kind == "D":
            rec.delivered[int(rest[0])] = (rest[1], int(rest[2]))
        elif kind == "A":
            rec.ack_sent.update(int(x) for x in rest)
        elif kind == "R":
            rec.receipted.update(int(x) for x in rest)
        else:
            raise AssertionError(f"bad record line {line!r}")
    return rec


class Progress:
    """Counts acknowledged sends and receipted acks in a growing record file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.sends = 0
        self.receipts = 0

    def poll(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            if line.startswith(b"S "):
                self.sends += 1
            elif line.startswith(b"R "):
                self.receipts += len(line.split()) - 1


async def create_queue(url: str, queue: str) -> None:
    async with Client(url) as client:
        await client.create_queue(queue)


async def drain(url: str, queue: str) -> tuple[list[Received], int]:
    """Everything the restarted node holds, with a fresh consumer; acked with a receipt."""
    async with Client(url) as client:
        depths = {q.name: q.depth for q in await client.queues()}
        assert queue in depths, f"queue {queue} is gone after the restart: {sorted(depths)}"
        depth = depths[queue]
        async with client.consumer(queue, name="after-crash", prefetch=500) as consumer:
            got: list[Received] = []
            unacked: list[Received] = []
            while len(got) < depth:
                m = await consumer.receive(DRAIN_WAIT_S)
                assert m is not None, f"only {len(got)} of {depth} stored messages came"
                got.append(m)
                unacked.append(m)
                if len(unacked) == 100 or len(got) == depth:
                    await asyncio.wait_for(consumer.ack_many(unacked, wait=True), DRAIN_WAIT_S)
                    unacked = []
            extra = await consumer.receive(0)  # deliveries come before the acks' receipt
            assert extra is None, f"more than the queue depth {depth} came: {extra}"
        depth_after = next(q.depth for q in await client.queues() if q.name == queue)
    return got, depth_after


def run_load_until_kill(
    node: NodeProcess, queue: str, record: Path, seq_base: int, load_kills: bool
) -> None:
    """Start the load, SIGKILL the node once enough happened, wait for the load to end.

    With `load_kills` the load process kills the node itself the moment an ack receipt
    arrives once the thresholds are met; otherwise this process kills it once it sees them
    met, wherever the load happens to be.
    """
    assert node.proc is not None
    stderr_path = record.with_suffix(".stderr")
    command = [
        sys.executable,
        str(LOAD_SCRIPT),
        node.url,
        queue,
        str(record),
        f"--groups={GROUPS}",
        f"--seq-base={seq_base}",
        f"--hold={HOLD}",
        f"--pad={len(PAD)}",
        f"--max-seconds={LOAD_TIMEOUT_S + 10}",
    ]
    if load_kills:
        command += [
            f"--kill-pid={node.proc.pid}",
            f"--kill-after-sends={KILL_AFTER_SENDS}",
            f"--kill-after-receipts={KILL_AFTER_RECEIPTS}",
        ]
    with stderr_path.open("wb") as stderr:
        load = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        progress = Progress(record)
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while True:
            progress.poll()
            if load_kills and node.proc.poll() is not None:
                break
            if not load_kills and (
                progress.sends >= KILL_AFTER_SENDS and progress.receipts >= KILL_AFTER_RECEIPTS
            ):
                break
            assert load.poll() is None, (
                f"load exited early ({load.returncode}): {stderr_path.read_text()}"
            )
            assert time.monotonic() < deadline, (
                f"load too slow: {progress.sends} sends, {progress.receipts} receipts "
                f"after {LOAD_TIMEOUT_S}s; node log:\n{node.log()[-3000:]}"
            )
            time.sleep(0.02)
        node.kill()  # SIGKILL, under load (a no-op if the load killed it already)
        load.wait(15)
    finally:
        if load.poll() is None:
            load.kill()
            load.wait()
    assert load.returncode == 0, f"load failed ({load.returncode}): {stderr_path.read_text()}"
    assert node.proc.returncode == -signal.SIGKILL, node.proc.returncode


def check_round(
    rec: Record, got: list[Received], receipted_before: set[int], seq_base: int
) -> dict[str, int]:
    """The assertions of one crash; returns a few counts for the report."""
    after_ids = [m.msg_id for m in got]
    after = set(after_ids)
    assert len(after) == len(after_ids), "a message was delivered twice after the restart"
    for m in got:
        assert m.persistent and m.body == f"{m.group_id}:{m.group_seq}:".encode() + PAD, m
        assert m.group_seq in rec.attempted[m.group_id], f"never sent in this round: {m}"
        if m.msg_id in rec.sent:
            assert rec.sent[m.msg_id] == (m.group_id, m.group_seq), m

    # (1) Every acknowledged send was acked with a receipt before the crash or is still there.
    # An ack sent without its receipt back may or may not have been committed: either is fine.
    lost = sorted(
        (g, s, i) for i, (g, s) in rec.sent.items() if i not in rec.ack_sent and i not in after
    )
    assert not lost, f"{len(lost)} acknowledged sends lost, e.g. (group, seq, id) {lost[:10]}"

    # (2) Nothing whose ack receipt arrived before the crash (or in earlier rounds) comes back.
    back = sorted(after & (rec.receipted | receipted_before))
    assert not back, f"{len(back)} acked messages delivered again, e.g. ids {back[:10]}"

    # (3) Per group: in JMSXGroupSeq order, consecutive, and below the first one left
    # everything was acked before the crash: no hole relative to what was sent.
    per_group: dict[str, list[int]] = defaultdict(list)
    for m in got:
        per_group[m.group_id].append(m.group_seq)
    acked: dict[str, set[int]] = defaultdict(set)
    for i in rec.ack_sent:
        g, s = rec.delivered[i]
        acked[g].add(s)
    for g, seqs in per_group.items():
        assert seqs == list(range(seqs[0], seqs[-1] + 1)), f"group {g} out of order: {seqs}"
        hole = [s for s in range(seq_base + 1, seqs[0]) if s not in acked[g]]
        assert not hole, f"group {g}: {hole[:10]} neither acked nor delivered after the restart"

    # (4) Delivered before the crash but not acked: delivered again after the restart. Only
    # their presence is asserted: delivery counts are stored on release, not on delivery, so
    # after a crash they come back with delivery_count 1 (reported as their_max_delivery_count).
    in_flight = {i for i in rec.delivered if i not in rec.ack_sent}
    assert in_flight, "the load consumer held nothing unacked at the crash"
    missing = sorted(in_flight - after)
    assert not missing, f"{len(missing)} unacked deliveries not redelivered, e.g. {missing[:10]}"
    counts = [m.delivery_count for m in got if m.msg_id in in_flight]
    unconfirmed = rec.ack_sent - rec.receipted
    return {
        "sends_acknowledged": len(rec.sent),
        "sends_unacknowledged": sum(map(len, rec.attempted.values())) - len(rec.sent),
        "of_which_stored": sum(1 for m in got if m.msg_id not in rec.sent),
        "acks_receipted": len(rec.receipted),
        "acks_without_receipt": len(unconfirmed),
        "of_which_redelivered": len(unconfirmed & after),
        "unacked_in_flight": len(in_flight),
        "their_max_delivery_count": max(counts),
        "delivered_after_restart": len(got),
    }


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["sqlite", "journal"])
def test_kill_9_under_load_loses_nothing_acknowledged(
    node_factory: Callable[..., NodeProcess], tmp_path: Path, fmt: str
) -> None:
    node = node_factory({"store": {"format": fmt}})
    queue = unique("crash")
    asyncio.run(create_queue(node.url, queue))
    receipted: set[int] = set()
    for rnd in range(ROUNDS):
        record = tmp_path / f"load{rnd}.txt"
        seq_base = rnd * SEQ_STEP
        run_load_until_kill(node, queue, record, seq_base, load_kills=rnd % 2 == 0)
        rec = read_record(record)
        assert len(rec.sent) >= KILL_AFTER_SENDS and len(rec.receipted) >= KILL_AFTER_RECEIPTS
        node.start()  # same data dir
        got, depth_after = asyncio.run(drain(node.url, queue))
        stats = check_round(rec, got, receipted, seq_base)
        print(f"round {rnd}: {stats}")
        assert depth_after == 0, f"{depth_after} messages left after acking all of them"
        receipted |= rec.receipted | {m.msg_id for m in got}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setting", "grouped_count", "fmt"),
    [("grouped", 2, "sqlite"), ("none", 1, "sqlite"), ("grouped", 2, "journal")],
)
async def test_messages_out_when_the_node_is_killed_come_back_with_their_delivery_count(
    tmp_path: Path, setting: str, grouped_count: int, fmt: str
) -> None:
    """A delivered, unacked message survives kill -9; with its count stored before delivery
    (the default for grouped messages) it comes back marked as a redelivery."""
    extra = {"persist-delivery-count-before-delivery": setting, "store": {"format": fmt}}
    node = NodeProcess(tmp_path, extra).start()
    queue = unique("counted")
    try:
        async with Client(node.url) as client:
            await client.create_queue(queue)
            await client.producer(queue, group_id="g").send_batch(["g1", "g2"])
            await client.producer(queue).send("plain")
            async with client.consumer(queue, prefetch=10) as consumer:
                out = [await consumer.receive(timeout=10) for _ in range(3)]
                assert sorted(m.body for m in out if m) == [b"g1", b"g2", b"plain"]
                assert {m.delivery_count for m in out if m} == {1}
                node.stop(signal.SIGKILL)
        node.start()
        async with Client(node.url) as client, client.consumer(queue, prefetch=10) as consumer:
            back = {}
            while len(back) < 3 and (m := await consumer.receive(timeout=10)) is not None:
                back[m.body] = m.delivery_count
                await m.ack()
        assert back == {b"g1": grouped_count, b"g2": grouped_count, b"plain": 1}
    finally:
        node.kill()
