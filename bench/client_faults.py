"""How fast faults are noticed and healed: client recovery after an outage, frozen nodes and peers.

Three measurements on real `pinmq node` processes (bench/harness), each with its baseline in
the same run:
1. Recovery after an outage: a node is stopped for `--outage` seconds (30 by default) and
   started again on the same ports and data. Two clients that were connected before keep
   sending one message every 50 ms throughout: one with pinmq's channel options (bounded
   reconnect backoff, broker/channels.py), one with gRPC's defaults. Printed: how long after
   the node served again each client's first send succeeded.
2. A frozen node (SIGSTOP) under a client's send: how long until the send fails (pinmq: a
   keepalive ping goes unanswered; gRPC defaults: nothing ends it, so the guard does).
3. A frozen peer in a three-node cluster: how long until the other nodes report it as not
   connected (Admin.ClusterStatus, polled every 50 ms).
Every process is stopped on exit, error, Ctrl-C or SIGTERM; no timing is asserted.

Usage: python bench/client_faults.py [--outage S] [--rounds R] [--guard S]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.nodes import NodeProc, running_node, running_nodes, wait_formed, wait_serving
from harness.procs import run_main

from broker.client import Client, PinmqError
from broker.client import connection as client_connection

GRPC_DEFAULTS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
SEND_EVERY_S = 0.05


@contextmanager
def grpc_default_channels() -> Iterator[None]:
    """Clients connected inside this block use gRPC's default keepalive and backoff."""
    options = client_connection.CHANNEL_OPTIONS
    client_connection.CHANNEL_OPTIONS = GRPC_DEFAULTS
    try:
        yield
    finally:
        client_connection.CHANNEL_OPTIONS = options


async def connected(url: str, grpc_defaults: bool = False) -> Client:
    """A connected client: pinmq's channel options, or gRPC's defaults (the baseline)."""
    with grpc_default_channels() if grpc_defaults else contextlib.nullcontext():
        client = Client(url)
        await client.connect()
    return client


async def keep_sending(client: Client, queue: str, ok_at: list[float], stop: asyncio.Event) -> None:
    """Send every SEND_EVERY_S until `stop`; record when each send succeeded."""
    producer = client.producer(queue)
    while not stop.is_set():
        try:
            await producer.send(b"x")
            ok_at.append(time.monotonic())
        except PinmqError:
            pass
        await asyncio.sleep(SEND_EVERY_S)


async def outage_round(node: NodeProc, outage_s: float, guard_s: float) -> dict[str, float]:
    """Seconds from the node serving again to each client's first successful send."""
    queue = f"outage-{uuid.uuid4().hex[:6]}"
    ours, theirs = await connected(node.url), await connected(node.url, grpc_defaults=True)
    await ours.create_queue(queue)
    stop = asyncio.Event()
    ok: dict[str, list[float]] = {"pinmq options": [], "gRPC defaults": []}
    tasks = [
        asyncio.create_task(keep_sending(c, queue, ok[k], stop))
        for c, k in ((ours, "pinmq options"), (theirs, "gRPC defaults"))
    ]
    await asyncio.sleep(0.5)
    print("    stopping the node", flush=True)
    node.proc.send_signal(signal.SIGTERM)
    await asyncio.to_thread(node.proc.wait, 30)
    down_at = time.monotonic()
    await asyncio.sleep(outage_s)
    print(f"    starting it again after {outage_s:g} s", flush=True)
    node.launch()
    await asyncio.to_thread(wait_serving, node)
    serving_at = time.monotonic()
    print("    serving; waiting for both clients' sends", flush=True)
    deadline = serving_at + guard_s
    while time.monotonic() < deadline and not all(
        times and times[-1] > down_at for times in ok.values()
    ):
        await asyncio.sleep(0.05)
    stop.set()
    print("    closing the clients", flush=True)
    await asyncio.gather(*tasks)
    for c in (ours, theirs):
        await c.close()
    return {
        k: max(0.0, min((t for t in times if t > down_at), default=float("inf")) - serving_at)
        for k, times in ok.items()
    }


async def frozen_send(url: str, pid: int, baseline: bool, guard_s: float) -> float:
    """Seconds until a send into a frozen node fails (inf: not within the guard)."""
    client = await connected(url, grpc_defaults=baseline)
    queue = f"frozen-{uuid.uuid4().hex[:6]}"
    await client.create_queue(queue)
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    try:
        async with asyncio.timeout(guard_s):
            await client.producer(queue).send(b"x")
        took = float("nan")  # it did not fail: it was answered
    except PinmqError:
        took = time.monotonic() - started
    except TimeoutError:
        took = float("inf")
    finally:
        os.kill(pid, signal.SIGCONT)
        await client.close()
    return took


async def frozen_peer(nodes: list[NodeProc], guard_s: float) -> float:
    """Seconds until node1 reports the frozen node2 as not connected."""
    async with Client(nodes[0].url) as client:
        os.kill(nodes[1].pid, signal.SIGSTOP)
        started = time.monotonic()
        try:
            while time.monotonic() - started < guard_s:
                status = await client.cluster_status()
                if not status.connected[nodes[1].node_id]:
                    return time.monotonic() - started
                await asyncio.sleep(0.05)
            return float("inf")
        finally:
            os.kill(nodes[1].pid, signal.SIGCONT)


def _line(label: str, values: list[float]) -> str:
    shown = ", ".join("> guard" if v == float("inf") else f"{v:.2f}" for v in values)
    finite = [v for v in values if v != float("inf")]
    median = f"median {statistics.median(finite):.2f} s" if finite else "never within the guard"
    return f"  {label:<16} {median}  ({shown})"


async def measure(args: argparse.Namespace) -> bool:
    print(
        f"pinmq fault timings: outage {args.outage:g} s x {args.rounds}, guard {args.guard:g} s; "
        f"machine load average {os.getloadavg()[0]:.2f}"
    )
    with tempfile.TemporaryDirectory(prefix="pinmq-faults-") as tmp:
        work = Path(tmp)
        with running_node(work / "single") as node:
            recovery: dict[str, list[float]] = {}
            for r in range(args.rounds):
                for k, v in (await outage_round(node, args.outage, args.guard)).items():
                    recovery.setdefault(k, []).append(v)
                print(f"  outage round {r + 1}/{args.rounds} done", flush=True)
            frozen: dict[str, list[float]] = {"pinmq options": [], "gRPC defaults": []}
            for _ in range(args.rounds):
                for label, baseline in (("pinmq options", False), ("gRPC defaults", True)):
                    took = await frozen_send(node.url, node.pid, baseline, args.guard)
                    frozen[label].append(took)
        with running_nodes(work / "cluster", 3, clustered=True) as nodes:
            await wait_formed(nodes)
            peer = []
            for _ in range(args.rounds):
                peer.append(await frozen_peer(nodes, args.guard))
                await wait_formed(nodes)
    print(f"\n== first successful send after a {args.outage:g} s outage, from the node serving ==")
    for label, values in recovery.items():
        print(_line(label, values))
    print("\n== a send into a frozen node: until it fails ==")
    for label, values in frozen.items():
        print(_line(label, values))
    print("\n== a frozen peer: until node1 reports node2 not connected ==")
    print(_line("pinmq options", peer))
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outage", type=float, default=30.0, help="seconds the node is down")
    parser.add_argument("--rounds", type=int, default=3, help="repetitions of each measurement")
    parser.add_argument("--guard", type=float, default=20.0, help="give up waiting after S")
    args = parser.parse_args()
    run_main(lambda: asyncio.run(measure(args)))


if __name__ == "__main__":
    main()
