"""An ha pair: failover gap and the cost of synchronous replication, and a backup's catch-up.

Real `pinmq node` processes on loopback (bench/harness): node1 (LOCAL), node2 and node3
(REMOTE), one of them (`--pair`, node1 unless told) an ha primary with a backup
(`<node>-backup`) whose voters are the other two nodes; defaults for every ha setting. Every
process is stopped on exit, error, Ctrl-C or SIGTERM; nothing is asserted on timing.

1. Failover gap, over `--drills` fresh clusters: a grouped producer sends one persistent
   message every 10 ms through the pair's two addresses while a consumer reads them; the
   pair's primary is killed with SIGKILL. Printed: from the kill to the first send the backup
   confirmed, and to the first message sent after the kill that the consumer received; p50
   and max. For node2's pair the group's route is asked of node1, the arbiter, which stays up.
2. Cost of synchronous replication: persistent grouped sends to the pair's primary through the
   Python client (`send_many`, 8 groups) and through STOMP (SEND frames, a receipt every 100),
   with the backup in sync, then in the same cluster after the backup is stopped (the primary
   goes on alone), as the baseline; after a warm-up, the median of `--rounds` rounds each.
   Printed: msg/s each and the ratio (`--messages 0`: no part 2).
3. Catch-up of node1's fresh backup: node1 serves alone (the backup not launched) while `--pending`
   persistent grouped messages fill a queue with no consumer; then a fresh backup (empty data
   dir) is launched while a steady load (a persistent grouped send every `--interval-ms` to a
   second queue, a consumer reading it) runs on node1. Printed: from the launch to the snapshot
   installed and to the backup in sync (node1's view and the backup's own); the load's rates
   and send latency during catch-up against a `--baseline` window of node1 alone just before
   the launch; node1's store size; how many snapshots it took, and why any broke off. Then
   node1 gets SIGKILL and the backup must answer with all pending messages in the queue (exit
   status 1 if not; also if not in sync within `--sync-limit` s).

Usage: python bench/ha.py [--pair node1|node2] [--drills N] [--messages N] [--rounds R]
                          [--catchup] [--pending N] [--interval-ms MS] [--baseline S]
                          [--sync-limit S]
(`--catchup`: part 3 only; `--pending 0`: no part 3)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from harness.gap import gap_drill
from harness.ha_logs import data_size, replication_log, takeover_steps
from harness.nodes import NodeProc, node_queues, wait_serving
from harness.procs import reserve_port, run_main, stop, tail
from harness.stats import pct

from broker.client import Client, PinmqError
from pinmq.stomp.frames import FrameParser, encode_frame

QUEUE = "orders"
LIVE = "live"  # the steady load's queue during catch-up
FILL_CHUNK = 100_000  # fill progress is printed after each
FAILOVER_WAIT_S = 600.0  # a bound on the backup answering after the kill, not a target
PROGRESS_S = 10.0  # catch-up progress is printed this often
GROUPS = [f"g{i}" for i in range(8)]
NODES = ("node1", "node2", "node3")
PAIRS = ("node1", "node2")  # the LOCAL arbiter's pair, a REMOTE node's pair
WAIT_S = 60.0
DRAIN_S = 10.0  # after the producer stops: time for the consumer to get what was confirmed


def _config(
    name: str, home: Path, listen: dict[str, str], clusters: dict[str, str], pair: str
) -> dict:
    """`pair`: the node with a backup (node1: the LOCAL arbiter; node2: a REMOTE node)."""
    node = pair if name.startswith(pair) else name
    config: dict[str, Any] = {
        "node": {"id": name, "data-dir": str(home / "data")},
        "listen": listen,
        "log": {"format": "json", "level": "info"},
        "cluster": {
            # every process of the other nodes: a pair's voters, the routes between nodes
            "connectors": [a for n, a in clusters.items() if not n.startswith(node)],
            "reconnect-interval": 200,
        },
        "grouping-handler": {"type": "LOCAL" if node == "node1" else "REMOTE"},
    }
    if name == pair:
        config["ha"] = {"role": "primary"}
    elif name == f"{pair}-backup":
        config["ha"] = {"role": "backup", "primary": clusters[pair]}
    return config


def _ha(node: NodeProc) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://{node.listen['http']}/readyz", timeout=1) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as err:
        body = json.loads(err.read())
    except OSError:
        return {}
    return body.get("ha") or {}


def _wait(what: str, check: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise RuntimeError(f"not within {WAIT_S} s: {what}")


@contextmanager
def ha_cluster(
    workdir: Path, backup: bool = True, pair: str = "node1"
) -> Iterator[dict[str, NodeProc]]:
    """The three nodes serving, `pair` with its backup in sync; without `backup`, the backup
    is configured but not launched (the primary serves alone until it is)."""
    names = (*NODES, f"{pair}-backup")
    listens = {
        n: {k: f"127.0.0.1:{reserve_port()}" for k in ("client", "stomp", "cluster", "http")}
        for n in names
    }
    clusters = {n: listens[n]["cluster"] for n in names}
    nodes: dict[str, NodeProc] = {}
    try:
        for name in names:
            home = workdir / name
            home.mkdir(parents=True)
            config = _config(name, home, listens[name], clusters, pair)
            (home / "node.yaml").write_text(yaml.safe_dump(config))
            node = NodeProc(name, listens[name], config["grouping-handler"]["type"], home)
            if backup or name != f"{pair}-backup":
                node.launch()
            nodes[name] = node
        for name in sorted(NODES, key=lambda n: n == pair):  # the pair's voters first
            wait_serving(nodes[name])
        if backup:
            _wait("the backup in sync", lambda: _ha(nodes[pair]).get("backup_in_sync"))
        yield nodes
    finally:
        stop(*(n.proc for n in nodes.values() if n.proc is not None))


# ---- 1. failover gap


async def _drill(workdir: Path, pair: str) -> tuple[float, float]:
    """One drill on a fresh cluster (bench/harness/gap.py): kill -9 of `pair`'s primary."""
    with ha_cluster(workdir, pair=pair) as nodes:
        url = f"{nodes[pair].url},{nodes[f'{pair}-backup'].url}"
        async with Client(url) as admin:
            await admin.create_queue(QUEUE)

        async def kill() -> None:
            nodes[pair].proc.send_signal(signal.SIGKILL)

        gap = await gap_drill(url, QUEUE, kill, WAIT_S, DRAIN_S)
        if gap.error:
            logs = "\n".join(
                f"== {name}\n{tail(node.log_path, 15)}" for name, node in nodes.items()
            )
            raise RuntimeError(f"{gap.error}\n{logs}")
        assert gap.first_send is not None and gap.first_seen is not None
        return gap.first_send - gap.killed_at, gap.first_seen - gap.killed_at


# ---- 2. cost of synchronous replication


async def _python_rate(url: str, messages: int, batch_size: int = 50) -> float:
    """msg/s of `messages` (rounded down to a multiple of 8) persistent grouped sends."""
    async with Client(url) as client:
        producers = [client.producer(QUEUE, group_id=g) for g in GROUPS]
        per = messages // len(producers)
        started = time.perf_counter()
        await asyncio.gather(
            *(
                p.send_many((b"x" * 100 for _ in range(per)), batch_size=batch_size)
                for p in producers
            )
        )
        return per * len(producers) / (time.perf_counter() - started)


def _stomp_rate(address: str, messages: int) -> float:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port))) as sock:
        parser = FrameParser()
        sock.sendall(encode_frame("CONNECT", {"accept-version": "1.2", "host": "/"}, b""))

        def frame() -> Any:
            while (f := parser.next()) is None:
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("STOMP connection closed")
                parser.feed(data)
            return f

        assert frame().command == "CONNECTED"
        started = time.perf_counter()
        window = 100
        for start in range(0, messages, window):
            frames = []
            for i in range(start, min(start + window, messages)):
                headers = {
                    "destination": f"/queue/{QUEUE}",
                    "JMSXGroupID": GROUPS[i % 8],
                    "persistent": "true",
                }
                if i == min(start + window, messages) - 1:
                    headers["receipt"] = str(i)
                frames.append(encode_frame("SEND", headers, b"x" * 100, version="1.2"))
            sock.sendall(b"".join(frames))
            reply = frame()
            if reply.command != "RECEIPT":
                raise RuntimeError(f"STOMP: {reply.command} {reply.headers}")
        return messages / (time.perf_counter() - started)


async def _rates(primary: NodeProc, messages: int, rounds: int) -> tuple[float, float]:
    """Median msg/s over `rounds` of each client, alternating them."""
    python, stomp = [], []
    for _ in range(rounds):
        python.append(await _python_rate(primary.url, messages))
        stomp.append(_stomp_rate(primary.listen["stomp"], messages))
    return statistics.median(python), statistics.median(stomp)


async def _cost(
    workdir: Path, pair: str, messages: int, rounds: int
) -> dict[str, tuple[float, float]]:
    with ha_cluster(workdir, pair=pair) as nodes:
        primary = nodes[pair]
        async with Client(primary.url) as admin:
            await admin.create_queue(QUEUE)
        await _rates(primary, messages // 4, 1)  # warm-up, not counted
        synced = await _rates(primary, messages, rounds)
        stop(nodes[f"{pair}-backup"].proc)
        _wait("the primary alone", lambda: _ha(primary).get("backup_in_sync") is False)
        alone = await _rates(primary, messages, rounds)
        return {"python": (synced[0], alone[0]), "stomp": (synced[1], alone[1])}


# ---- 3. catch-up of a fresh backup


class _Flow:
    """The steady load while the backup catches up: persistent grouped sends to LIVE, paced
    (one every `interval_s` over the 8 groups, each group waiting for its previous send), and a
    consumer reading them; every send's start and latency are kept, to compare windows."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.sends: list[tuple[float, float]] = []  # (monotonic start, latency s)
        self.received: list[float] = []  # monotonic arrival of each delivery
        self.done = asyncio.Event()

    async def run(self, url: str) -> None:
        async with Client(url) as client:
            slot = self.interval_s * len(GROUPS)
            start = time.monotonic()
            await asyncio.gather(
                *(
                    self._produce(client, g, start + i * self.interval_s, slot)
                    for i, g in enumerate(GROUPS)
                ),
                self._consume(client),
            )

    async def _produce(self, client: Client, group: str, next_at: float, slot: float) -> None:
        producer = client.producer(LIVE, group_id=group)
        while not self.done.is_set():
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            started = time.monotonic()
            await producer.send(b"x" * 100)
            self.sends.append((started, time.monotonic() - started))
            next_at = max(next_at + slot, time.monotonic())  # late: no burst to catch up

    async def _consume(self, client: Client) -> None:
        async with client.consumer(LIVE) as consumer:
            while not self.done.is_set():
                msg = await consumer.receive(timeout=0.5)
                if msg is not None:
                    await msg.ack()
                    self.received.append(time.monotonic())

    def window(self, start: float, end: float) -> str:
        """Sends and deliveries in [start, end): rates, send latency p50 and p99."""
        latencies = sorted(lat for t, lat in self.sends if start <= t < end)
        received = sum(1 for t in self.received if start <= t < end)
        span = end - start
        if not latencies:
            return f"no send completed in {span:.1f} s"
        p50, p99 = pct(latencies, 0.5) * 1000, pct(latencies, 0.99) * 1000
        return (
            f"{len(latencies) / span:.0f} msg/s sent, {received / span:.0f} msg/s delivered, "
            f"send p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {latencies[-1] * 1000:.0f} ms"
        )


async def _fill(url: str, pending: int) -> int:
    """`pending` persistent grouped messages to QUEUE, no consumer; how many were sent."""
    sent, started = 0, time.perf_counter()
    for done in range(0, pending, FILL_CHUNK):
        chunk = min(FILL_CHUNK, pending - done) // len(GROUPS) * len(GROUPS)
        if chunk:
            await _python_rate(url, chunk, batch_size=500)
        sent += chunk
        rate = sent / (time.perf_counter() - started)
        print(f"fill: {sent} of {pending} pending, {rate:.0f} msg/s", file=sys.stderr)
    return sent


async def _until_synced(primary: NodeProc, backup: NodeProc, limit_s: float) -> dict[str, float]:
    """Poll both processes' /readyz from the backup's launch; monotonic times of each step:
    snapshot installed ("following"), the primary's backup_in_sync, the backup's in_sync (a
    step undone, by a new snapshot or a drop, counts again from when it comes back). Returns
    early, without both in sync, once `limit_s` has passed."""
    seen: dict[str, float] = {}
    started = time.monotonic()
    report_at = started + PROGRESS_S
    while not {"primary", "backup"} <= seen.keys():
        if backup.proc.poll() is not None:
            raise RuntimeError(f"the backup exited:\n{tail(backup.log_path)}")
        if time.monotonic() > started + limit_s:
            break
        ours, theirs = await asyncio.gather(
            asyncio.to_thread(_ha, primary), asyncio.to_thread(_ha, backup)
        )
        now = time.monotonic()
        steps = {"primary": (ours, ours.get("backup_in_sync"))}
        steps["following"] = (theirs, theirs.get("replication") == "following")
        steps["backup"] = (theirs, theirs.get("in_sync"))
        for key, (answer, reached) in steps.items():
            if answer and not reached:  # no answer (a busy node) undoes nothing
                seen.pop(key, None)
            elif reached:
                seen.setdefault(key, now)
        if now > report_at:
            report_at = now + PROGRESS_S
            attempts = replication_log(primary, backup)["snapshots begun"]
            print(
                f"catch-up {now - started:.0f} s: backup {theirs.get('replication')}, "
                f"{ours.get('backup_behind')} writes behind, snapshot attempts {attempts}",
                file=sys.stderr,
            )
        await asyncio.sleep(0.05)
    return seen


async def _depth_after_kill(backup: NodeProc, queue: str) -> tuple[int, float]:
    """Depth of `queue` once the backup answers after the primary's kill; and how long that
    took (s)."""
    killed = time.monotonic()
    deadline = killed + FAILOVER_WAIT_S
    while True:
        try:
            depths = await node_queues(backup)
            return depths[queue][0], time.monotonic() - killed
        except (PinmqError, TimeoutError):
            if backup.proc.poll() is not None or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _catchup(
    workdir: Path, pending: int, interval_s: float, baseline_s: float, limit_s: float
) -> bool:
    """Fill node1 alone, then launch a fresh backup under a steady load; kill -9 node1 once
    in sync and count what the backup holds."""
    with ha_cluster(workdir, backup=False) as nodes:
        primary, backup = nodes["node1"], nodes["node1-backup"]
        async with Client(primary.url) as admin:
            await admin.create_queue(QUEUE)
            await admin.create_queue(LIVE)
        fill_started = time.perf_counter()
        sent = await _fill(primary.url, pending)
        fill_rate = sent / (time.perf_counter() - fill_started)
        filled_size = data_size(primary)
        flow = _Flow(interval_s)
        flowing = asyncio.create_task(flow.run(primary.url))
        try:
            await asyncio.sleep(1.0)  # warm-up, not counted
            baseline_from = time.monotonic()
            await asyncio.sleep(baseline_s)
            launched = time.monotonic()
            backup.launch()
            print("backup launched, catching up", file=sys.stderr)
            seen = await _until_synced(primary, backup, limit_s)
        finally:
            flow.done.set()
            await flowing
        ended = seen.get("primary", time.monotonic())
        synced_size = data_size(primary)
        replication = replication_log(primary, backup)
        depth, answered_s, takeover = -1, 0.0, []
        if in_sync := {"primary", "backup"} <= seen.keys():
            killed_at = time.time()
            primary.proc.send_signal(signal.SIGKILL)
            depth, answered_s = await _depth_after_kill(backup, QUEUE)
            takeover = takeover_steps(backup, killed_at)
    print(
        f"catch-up of a fresh backup: {sent} pending persistent messages of 100 bytes "
        f"(8 groups) on node1, filled alone at {fill_rate:.0f} msg/s; then a steady load "
        f"(one persistent grouped send every {interval_s * 1000:g} ms to another queue, "
        f"a consumer reading it) while the backup catches up:"
    )
    print(f"  node1 data after the fill: {filled_size}; at the end: {synced_size}")
    steps = (("snapshot installed", "following"), ("node1 reports it in sync", "primary"))
    for label, key in (*steps, ("the backup knows it is in sync", "backup")):
        if key in seen:
            print(f"  backup launch -> {label}: {seen[key] - launched:.1f} s")
    print(f"  node1 alone ({baseline_s:g} s):  {flow.window(baseline_from, launched)}")
    print(f"  during catch-up ({ended - launched:.1f} s): {flow.window(launched, ended)}")
    for what, count in replication.items():
        print(f"  until then, {what}: {count}")
    if not in_sync:
        print(f"  FAIL: the backup not in sync within {limit_s:g} s (--sync-limit)")
        return False
    ok = depth == sent
    verdict = "PASS" if ok else "FAIL"
    print(
        f"  kill -9 of node1 after sync: the backup answered in {answered_s:.1f} s, "
        f"{QUEUE} holds {depth} of {sent}: {verdict}"
    )
    for step, at in takeover:
        print(f"    kill -> the backup's log: {step}: {at:.2f} s")
    return ok


def main() -> bool:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pair", choices=PAIRS, default="node1", help="the node with a backup, parts 1 and 2"
    )
    parser.add_argument("--drills", type=int, default=10)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--catchup", action="store_true", help="run only part 3")
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--interval-ms", type=float, default=2.0)
    parser.add_argument("--baseline", type=float, default=20.0, help="seconds")
    parser.add_argument(
        "--sync-limit", type=float, default=1800.0, help="seconds to wait for the backup in sync"
    )
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory(prefix="pinmq-bench-ha-") as tmp:
        work = Path(tmp)
        if not args.catchup:
            _gap_and_cost(work, args.pair, args.drills, args.messages, args.rounds)
        if args.pending:
            interval_s = args.interval_ms / 1000
            ok = asyncio.run(
                _catchup(work / "catchup", args.pending, interval_s, args.baseline, args.sync_limit)
            )
    return ok


def _gap_and_cost(work: Path, pair: str, drills: int, messages: int, rounds: int) -> None:
    """Parts 1 and 2 on `pair`, printed."""
    sends, seens = [], []
    for i in range(drills):
        send_gap, seen_gap = asyncio.run(_drill(work / f"drill{i}", pair))
        sends.append(send_gap)
        seens.append(seen_gap)
        gaps = f"send {send_gap * 1000:.0f} ms, delivery {seen_gap * 1000:.0f} ms"
        print(f"drill {i + 1}: first after kill -9: {gaps}", file=sys.stderr)
    if drills:
        print(f"failover gap over {drills} drills (kill -9 of {pair}, defaults):")
    for label, gaps_s in (
        ("first grouped send confirmed", sends),
        ("first delivery through the backup", seens),
    ):
        if gaps_s:
            p50, top = statistics.median(gaps_s) * 1000, max(gaps_s) * 1000
            print(f"  {label}: p50 {p50:.0f} ms, max {top:.0f} ms")
    if not messages:
        return
    cost = asyncio.run(_cost(work / "cost", pair, messages, rounds))
    print(
        f"persistent grouped sends to {pair}, {messages} messages of 100 bytes, "
        f"8 groups, median of {rounds} rounds:"
    )
    for label, (synced, alone) in cost.items():
        rates = f"{synced:.0f} msg/s with the backup in sync, {alone:.0f} msg/s alone"
        print(f"  {label}: {rates}: ratio {synced / alone:.2f}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        run_main(main)
