"""What one client's heavy request costs the others: a canary's latency under each load.

One `pinmq node` (bench/harness). A canary client sends a persistent message every 20 ms to
its own queue and receives it on a consumer; its latency is send-to-receipt. Each load runs
in a process of its own for `--seconds` while the canary measures, the idle run first as the
baseline:
- `idle`: nothing else.
- `max-batch`: back-to-back SendBatch calls of `limits.max-batch-messages` (1,000) 1-byte
  non-persistent messages, to a queue nobody consumes.
- `refused-batch`: back-to-back SendBatch calls of 1,000,000 1-byte messages (7 MB): the
  node refuses each as too large, after decoding it.
- `subscribe-burst`: with `--queues` queues already there, a STOMP connection writes 1,000
  SUBSCRIBE frames to new queues in one write, each auto-creating its queue; again every
  second, on a new connection.
- `persistent-bulk`: `send_many` of persistent 100-byte messages at full speed (batches of
  500, 8 in flight), drained by a consumer.
Printed per load: canary samples, p50, p99 and max latency (ms), and p99 over the idle p99.
No timing is asserted; every process is stopped on exit, error, Ctrl-C or SIGTERM.

Usage: python bench/canary.py [--seconds S] [--queues N] [--loads NAME...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from harness.nodes import running_node
from harness.procs import run_main
from harness.stats import pct

from broker.client import Client, PinmqError
from broker.config import LimitsSection
from pinmq.stomp.frames import encode_frame

CANARY_EVERY_S = 0.02
MAX_BATCH = LimitsSection().max_batch_messages  # the node's default limit
SUBSCRIBES = 1_000


async def _max_batch(url: str, _stomp: int, seconds: float) -> None:
    async with Client(url) as client:
        producer = client.producer(f"bulk-{uuid.uuid4().hex[:6]}", persistent=False)
        items = [b"x"] * MAX_BATCH
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await producer.send_batch(items)


async def _refused_batch(url: str, _stomp: int, seconds: float) -> None:
    async with Client(url) as client:
        producer = client.producer("refused", persistent=False)
        items = [b"x"] * 1_000_000
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with contextlib.suppress(PinmqError):  # refused: too large, as it should be
                await producer.send_batch(items)


async def _subscribe_burst(_url: str, stomp: int, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        round_started = time.monotonic()
        tag = uuid.uuid4().hex[:6]
        frames = [encode_frame("CONNECT", {"accept-version": "1.2", "host": "x"}, b"")]
        frames += [
            encode_frame("SUBSCRIBE", {"destination": f"sub-{tag}-{i}", "id": str(i)}, b"")
            for i in range(SUBSCRIBES)
        ]
        frames.append(encode_frame("DISCONNECT", {"receipt": "bye"}, b""))
        reader, writer = await asyncio.open_connection("127.0.0.1", stomp)
        writer.write(b"".join(frames))
        await writer.drain()
        while await reader.read(65536):  # until the node closes it after the RECEIPT
            pass
        writer.close()
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - round_started)))


async def _persistent_bulk(url: str, _stomp: int, seconds: float) -> None:
    queue = f"pbulk-{uuid.uuid4().hex[:6]}"
    async with Client(url) as client:
        await client.create_queue(queue)
        producer = client.producer(queue)

        async def drain() -> None:
            async with client.consumer(queue, prefetch=1000) as consumer:
                while True:
                    got = []
                    while len(got) < 500 and (m := await consumer.receive(timeout=0.05)):
                        got.append(m)
                    if got:
                        await consumer.ack_many(got)

        drainer = asyncio.create_task(drain())
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                await producer.send_many([b"p" * 100] * 5_000, batch_size=500, window=8)
        finally:
            drainer.cancel()


LOADS: dict[str, Callable[[str, int, float], object] | None] = {
    "idle": None,
    "max-batch": _max_batch,
    "refused-batch": _refused_batch,
    "subscribe-burst": _subscribe_burst,
    "persistent-bulk": _persistent_bulk,
}


def _run_load(name: str, url: str, stomp: int, seconds: float) -> None:
    load = LOADS[name]
    assert load is not None
    asyncio.run(load(url, stomp, seconds))  # type: ignore[arg-type]


async def canary(url: str, seconds: float) -> list[float]:
    """Send-to-receipt latencies (ms) of a message every CANARY_EVERY_S for `seconds`."""
    queue = f"canary-{uuid.uuid4().hex[:6]}"
    latencies: list[float] = []
    async with Client(url) as client:
        await client.create_queue(queue)
        producer = client.producer(queue)
        async with client.consumer(queue) as consumer:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                began = time.monotonic()
                await producer.send(b"canary")
                m = await consumer.receive(timeout=30)
                assert m is not None
                latencies.append((time.monotonic() - began) * 1000)
                await m.ack()
                await asyncio.sleep(max(0.0, CANARY_EVERY_S - (time.monotonic() - began)))
    return latencies


async def precreate(url: str, count: int) -> None:
    async with Client(url) as client:
        for i in range(count):
            await client.create_queue(f"pre-{i}")


def main() -> bool:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per load (10)")
    parser.add_argument("--queues", type=int, default=2_000, help="queues made first (2000)")
    parser.add_argument("--loads", nargs="+", choices=list(LOADS), default=list(LOADS))
    args = parser.parse_args()
    spawn = multiprocessing.get_context("spawn")
    with (
        tempfile.TemporaryDirectory(prefix="pinmq-canary-") as tmp,
        running_node(
            Path(tmp),
            {"limits": {"max-queues": 100_000}},  # the bursts make 1,000 a second
        ) as n,
    ):
        stomp = int(n.listen["stomp"].rpartition(":")[2])
        asyncio.run(precreate(n.url, args.queues))
        print(
            f"node {n.url}, {args.queues} queues made; canary every {CANARY_EVERY_S * 1000:.0f} ms"
        )
        rows = []
        for name in args.loads:
            worker = None
            if LOADS[name] is not None:
                worker = spawn.Process(
                    target=_run_load, args=(name, n.url, stomp, args.seconds + 1)
                )
                worker.start()
                time.sleep(1.0)  # the load is under way before the canary starts
            try:
                lat = sorted(asyncio.run(canary(n.url, args.seconds)))
            finally:
                if worker is not None:
                    worker.join(timeout=args.seconds + 30)
                    if worker.is_alive():
                        worker.kill()
            rows.append((name, len(lat), pct(lat, 0.5), pct(lat, 0.99), lat[-1]))
            print(f"  {name:16} done", flush=True)
        idle_p99 = rows[0][3] if rows[0][0] == "idle" else None
        heads = ("samples", "p50 ms", "p99 ms", "max ms", "p99/idle")
        print(f"\n{'load':16} " + " ".join(f"{h:>8}" for h in heads))
        for name, count, p50, p99, top in rows:
            ratio = f"{p99 / idle_p99:.1f}x" if idle_p99 else "-"
            print(f"{name:16} {count:8d} {p50:8.1f} {p99:8.1f} {top:8.1f} {ratio:>8}")
    return True


if __name__ == "__main__":
    run_main(main)
