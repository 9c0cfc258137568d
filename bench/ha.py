"""The LOCAL node's replicated backup: failover gap and the cost of synchronous replication.

Real `pinmq node` processes on loopback (bench/harness): node1 (ha primary), node1-backup,
node2 and node3 (REMOTE, the voters), defaults for every ha setting. Every process is stopped
on exit, error, Ctrl-C or SIGTERM; nothing is asserted on timing.

1. Failover gap, over `--drills` fresh clusters: a grouped producer sends one persistent
   message every 10 ms through the pair's two addresses while a consumer reads them; node1 is
   killed with SIGKILL. Printed: from the kill to the first send the backup confirmed, and to
   the first message sent after the kill that the consumer received; p50 and max.
2. Cost of synchronous replication: persistent grouped sends to node1 through the Python
   client (`send_many`, 8 groups) and through STOMP (SEND frames, a receipt every 100), with
   the backup in sync, then in the same cluster after the backup is stopped (the primary goes
   on alone), as the baseline; after a warm-up, the median of `--rounds` rounds each.
   Printed: msg/s each and the ratio.

Usage: python bench/ha.py [--drills N] [--messages N] [--rounds R]
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
from harness.nodes import NodeProc, wait_serving
from harness.procs import reserve_port, run_main, stop, tail

from broker.client import Client
from pinmq.stomp.frames import FrameParser, encode_frame

QUEUE = "orders"
GROUPS = [f"g{i}" for i in range(8)]
NAMES = ("node1", "node1-backup", "node2", "node3")
WAIT_S = 60.0


def _config(name: str, home: Path, listen: dict[str, str], clusters: dict[str, str]) -> dict:
    pair = name.startswith("node1")
    voters = [clusters["node2"], clusters["node3"]]
    config: dict[str, Any] = {
        "node": {"id": name, "data-dir": str(home / "data")},
        "listen": listen,
        "log": {"format": "json", "level": "info"},
        "cluster": {
            "connectors": voters if pair else [a for n, a in clusters.items() if n != name],
            "reconnect-interval": 200,
        },
        "grouping-handler": {"type": "LOCAL" if pair else "REMOTE"},
    }
    if name == "node1":
        config["ha"] = {"role": "primary"}
    elif name == "node1-backup":
        config["ha"] = {"role": "backup", "primary": clusters["node1"]}
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
def ha_cluster(workdir: Path) -> Iterator[dict[str, NodeProc]]:
    listens = {
        n: {k: f"127.0.0.1:{reserve_port()}" for k in ("client", "stomp", "cluster", "http")}
        for n in NAMES
    }
    clusters = {n: listens[n]["cluster"] for n in NAMES}
    nodes: dict[str, NodeProc] = {}
    try:
        for name in NAMES:
            home = workdir / name
            home.mkdir(parents=True)
            config = _config(name, home, listens[name], clusters)
            (home / "node.yaml").write_text(yaml.safe_dump(config))
            node = NodeProc(name, listens[name], config["grouping-handler"]["type"], home)
            node.launch()
            nodes[name] = node
        for name in ("node2", "node3", "node1"):
            wait_serving(nodes[name])
        _wait("the backup in sync", lambda: _ha(nodes["node1"]).get("backup_in_sync"))
        yield nodes
    finally:
        stop(*(n.proc for n in nodes.values() if n.proc is not None))


# ---- 1. failover gap


async def _drill(workdir: Path) -> tuple[float, float]:
    with ha_cluster(workdir) as nodes:
        url = f"{nodes['node1'].url},{nodes['node1-backup'].url}"
        async with Client(url) as admin:
            await admin.create_queue(QUEUE)
        killed_at: list[float] = []
        first_send: list[float] = []
        first_seen: list[float] = []

        async def produce(stop_at: asyncio.Event) -> None:
            async with Client(url) as client:
                producer = client.producer(QUEUE, group_id="g")
                i = 0
                while not stop_at.is_set():
                    sent_after_kill = bool(killed_at)
                    await producer.send(f"{i}:{int(sent_after_kill)}")
                    if sent_after_kill and not first_send:
                        first_send.append(time.monotonic())
                    i += 1
                    await asyncio.sleep(0.01)

        async def consume(stop_at: asyncio.Event) -> None:
            async with Client(url) as client, client.consumer(QUEUE) as consumer:
                while not stop_at.is_set():
                    msg = await consumer.receive(timeout=0.5)
                    if msg is None:
                        continue
                    await msg.ack()
                    if msg.text.endswith(":1") and not first_seen:
                        first_seen.append(time.monotonic())

        done = asyncio.Event()
        tasks = [asyncio.create_task(produce(done)), asyncio.create_task(consume(done))]
        await asyncio.sleep(1.0)  # steady flow first
        nodes["node1"].proc.send_signal(signal.SIGKILL)
        killed_at.append(time.monotonic())
        deadline = time.monotonic() + WAIT_S
        while not (first_send and first_seen) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        done.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if not (first_send and first_seen):
            logs = "\n".join(
                f"== {name}\n{tail(node.log_path, 15)}" for name, node in nodes.items()
            )
            raise RuntimeError(f"no send or delivery through the backup after the kill\n{logs}")
        return first_send[0] - killed_at[0], first_seen[0] - killed_at[0]


# ---- 2. cost of synchronous replication


async def _python_rate(url: str, messages: int) -> float:
    async with Client(url) as client:
        producers = [client.producer(QUEUE, group_id=g) for g in GROUPS]
        per = messages // len(producers)
        started = time.perf_counter()
        await asyncio.gather(
            *(p.send_many((b"x" * 100 for _ in range(per)), batch_size=50) for p in producers)
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


async def _cost(workdir: Path, messages: int, rounds: int) -> dict[str, tuple[float, float]]:
    with ha_cluster(workdir) as nodes:
        primary = nodes["node1"]
        async with Client(primary.url) as admin:
            await admin.create_queue(QUEUE)
        await _rates(primary, messages // 4, 1)  # warm-up, not counted
        synced = await _rates(primary, messages, rounds)
        stop(nodes["node1-backup"].proc)
        _wait("the primary alone", lambda: _ha(primary).get("backup_in_sync") is False)
        alone = await _rates(primary, messages, rounds)
        return {"python": (synced[0], alone[0]), "stomp": (synced[1], alone[1])}


def main() -> bool:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drills", type=int, default=10)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pinmq-bench-ha-") as tmp:
        work = Path(tmp)
        sends, seens = [], []
        for i in range(args.drills):
            send_gap, seen_gap = asyncio.run(_drill(work / f"drill{i}"))
            sends.append(send_gap)
            seens.append(seen_gap)
            gaps = f"send {send_gap * 1000:.0f} ms, delivery {seen_gap * 1000:.0f} ms"
            print(f"drill {i + 1}: first after kill -9: {gaps}", file=sys.stderr)
        if args.drills:
            print(f"failover gap over {args.drills} drills (kill -9 of node1, defaults):")
        for label, gaps_s in (
            ("first grouped send confirmed", sends),
            ("first delivery through the backup", seens),
        ):
            if gaps_s:
                p50, top = statistics.median(gaps_s) * 1000, max(gaps_s) * 1000
                print(f"  {label}: p50 {p50:.0f} ms, max {top:.0f} ms")
        cost = asyncio.run(_cost(work / "cost", args.messages, args.rounds))
        print(
            f"persistent grouped sends to node1, {args.messages} messages of 100 bytes, "
            f"8 groups, median of {args.rounds} rounds:"
        )
        for label, (synced, alone) in cost.items():
            rates = f"{synced:.0f} msg/s with the backup in sync, {alone:.0f} msg/s alone"
            print(f"  {label}: {rates}: ratio {synced / alone:.2f}")
    return True


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        run_main(main)
