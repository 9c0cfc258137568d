"""`pinmq load`: an audited grouped load on a running cluster, the client side of the history
that `pinmq check` judges.

Producers send persistent messages of `--groups` groups, each group from one producer and one
send at a time (its next send waits for the node's confirmation), paced to `--rate` messages
a second in all; consumers receive and ack. Every client audits to `--audit` under a writer
name of its own (`load-<run>-p1`, `-c1`...), and over an address list they fail over as any
client does (over gRPC, or STOMP with `--protocol stomp`: pinmq/stomp_client.py). A line a
second says how far the load got. At `--duration`, or on Ctrl-C
(SIGINT or SIGTERM), the producers stop, the consumers get up to `--drain` seconds to ack
everything confirmed (a second Ctrl-C ends that wait), and every audit log is closed whole.

A group whose send fails for good (the client found no node within its failover timeout, or
the outcome is unknown) sends no more: a later message of it sent elsewhere could arrive
before the one in doubt, and the history would blame the broker for the client's reorder.
Exit status: 0, or 1 if a confirmed message was never acked within the drain (an ack whose
outcome is unknown is counted apart: the history tells).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import signal
import sys
import time
import uuid
from array import array
from dataclasses import dataclass, field

from broker.client import AlreadyExists, Client, ConnectionLost, OutcomeUnknown, PinmqError
from pinmq.stomp_client import StompClient
from pinmq.verbs import client_of, credentials, tls_files

PROGRESS_S = 1.0
IDLE_S = 0.2  # a consumer's wait for a message before it looks at the clock again


@dataclass
class Tally:
    """What the load did so far. A message is known by the `<group>:<seq>:` its body starts
    with, so the sets count each once however often it was delivered."""

    sent: int = 0  # sends begun
    confirmed: set[bytes] = field(default_factory=set)
    received: int = 0  # deliveries, redeliveries included
    acked: set[bytes] = field(default_factory=set)
    # Acks whose receipt never came (the stream ended first): committed, or the message comes
    # again and is acked then. Only `pinmq check` can tell; the load does not wait for them.
    unsure: set[bytes] = field(default_factory=set)
    errors: int = 0
    failovers: int = 0
    latencies: array[float] = field(default_factory=lambda: array("d"))  # confirmed sends, s

    def missing(self) -> set[bytes]:
        """Confirmed messages neither acked nor acked with an unknown outcome."""
        return self.confirmed - self.acked - self.unsure

    def line(self, elapsed_s: float) -> str:
        return (
            f"{elapsed_s:6.0f} s  sent {self.sent}  confirmed {len(self.confirmed)}  "
            f"received {self.received}  acked {len(self.acked)}  errors {self.errors}  "
            f"failovers {self.failovers}"
        )


async def run_load(args: argparse.Namespace) -> int:
    """The load as the command line says; its exit status."""
    tally = Tally()
    run = uuid.uuid4().hex[:6]
    stopping, draining_over = asyncio.Event(), asyncio.Event()
    _on_interrupt(stopping, draining_over)

    def moved(text: str) -> None:
        tally.failovers += 1
        print(f"pinmq: {text}", file=sys.stderr, flush=True)

    tls = tls_files(args)
    user, password = credentials(args) or (None, None)  # read once, for every client

    def connect(role: str, n: int) -> Client | StompClient:
        name = f"load-{run}-{role}{n}"
        if args.protocol == "grpc":
            login = {"tls": tls, "user": user, "password": password}
            return client_of(args, audit_name=name, on_failover=moved, **login)
        return StompClient(
            args.url,
            tls=tls,
            user=user,
            password=password,
            audit=args.audit,
            audit_name=name,
            on_failover=moved,
        )

    producers = [connect("p", n + 1) for n in range(args.producers)]
    consumers = [connect("c", n + 1) for n in range(args.consumers)]
    async with contextlib.AsyncExitStack() as stack:
        for c in (*consumers, *producers):
            await stack.enter_async_context(c)
        client = producers[0]
        if isinstance(client, Client):  # STOMP has no verb for it: the node creates the queue
            with contextlib.suppress(AlreadyExists):
                await client.create_queue(args.queue)
        started = time.monotonic()
        printing = asyncio.ensure_future(_progress(tally, started))
        reading = [asyncio.ensure_future(_consume(c, args.queue, tally)) for c in consumers]
        interval_s = args.groups / args.rate  # each group's pace
        body = b"x" * args.size
        sending = [
            asyncio.ensure_future(
                _group(producers[g % len(producers)], args.queue, f"g{g:03d}", interval_s, body,
                       tally, stopping)
            )
            for g in range(args.groups)
        ]  # fmt: skip
        if args.duration:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), args.duration)
        else:
            await stopping.wait()
        stopping.set()
        await asyncio.gather(*sending)
        await _drain(tally, args.drain, draining_over)
        for task in (printing, *reading):
            task.cancel()
        await asyncio.gather(printing, *reading, return_exceptions=True)
        print(tally.line(time.monotonic() - started), flush=True)
    return _summary(tally, time.monotonic() - started)


def _on_interrupt(stopping: asyncio.Event, draining_over: asyncio.Event) -> None:
    """The first Ctrl-C (or SIGTERM) stops the producers, the second the drain."""
    loop = asyncio.get_running_loop()

    def interrupted() -> None:
        (draining_over if stopping.is_set() else stopping).set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupted)


async def _group(
    client: Client | StompClient,
    queue: str,
    group: str,
    interval_s: float,
    body: bytes,
    tally: Tally,
    stopping: asyncio.Event,
) -> None:
    """One group's messages, in order, one at a time, every `interval_s` at most."""
    producer = client.producer(queue, group_id=group)
    loop = asyncio.get_running_loop()
    due = loop.time()
    for seq in itertools.count():
        if stopping.is_set():
            return
        key = f"{group}:{seq}:".encode()
        tally.sent += 1
        began = loop.time()
        try:
            await producer.send(key + body)
        except PinmqError as err:
            tally.errors += 1
            print(f"pinmq: {group} stopped at message {seq}: {err}", file=sys.stderr, flush=True)
            return
        tally.latencies.append(loop.time() - began)
        tally.confirmed.add(key)
        due = max(due + interval_s, loop.time())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), due - loop.time())


async def _consume(client: Client | StompClient, queue: str, tally: Tally) -> None:
    """Receive and ack until cancelled. A message received before a failover cannot be acked
    any more: the node delivers it again."""
    async with client.consumer(queue) as consumer:
        while True:
            try:
                message = await consumer.receive(IDLE_S)
            except PinmqError as err:  # no node within the failover timeout: keep trying
                tally.errors += 1
                print(f"pinmq: a consumer lost its node: {err}", file=sys.stderr, flush=True)
                await asyncio.sleep(PROGRESS_S)
                continue
            if message is None:
                continue
            tally.received += 1
            key = _key(message.body)
            try:
                await message.ack(wait=True)
            except ConnectionLost:
                continue
            except OutcomeUnknown:
                tally.unsure.add(key)
                continue
            except PinmqError as err:
                tally.errors += 1
                print(f"pinmq: an ack failed: {err}", file=sys.stderr, flush=True)
                continue
            tally.acked.add(key)


async def _progress(tally: Tally, started: float) -> None:
    while True:
        await asyncio.sleep(PROGRESS_S)
        print(tally.line(time.monotonic() - started), flush=True)


async def _drain(tally: Tally, drain_s: float, over: asyncio.Event) -> None:
    """Until every confirmed message is acked (or its ack's outcome is unknown), for `drain_s`
    at most (or a second Ctrl-C)."""
    deadline = time.monotonic() + drain_s
    while tally.missing() and time.monotonic() < deadline:
        if over.is_set():
            return
        await asyncio.sleep(0.05)


def _summary(tally: Tally, elapsed_s: float) -> int:
    missing = len(tally.missing())
    unsure = len(tally.unsure - tally.acked)
    lat = sorted(tally.latencies)
    figures = (
        f"send p50 {_at(lat, 0.5) * 1000:.1f} ms, p99 {_at(lat, 0.99) * 1000:.1f} ms"
        if lat
        else "no send confirmed"
    )
    print(
        f"load done in {elapsed_s:.1f} s: {len(tally.confirmed)} confirmed "
        f"({len(tally.confirmed) / elapsed_s:.0f} msg/s), {len(tally.acked)} acked, "
        f"{tally.errors} errors, {tally.failovers} failovers; {figures}"
    )
    if unsure:
        print(
            f"pinmq: {unsure} acks of unknown outcome (their stream ended before the receipt): "
            "pinmq check tells whether they were committed",
            file=sys.stderr,
        )
    if missing:
        print(f"pinmq: {missing} confirmed messages not acked within the drain", file=sys.stderr)
        return 1
    return 0


def _key(body: bytes) -> bytes:
    """The `<group>:<seq>:` a load's message starts with (another's body: itself)."""
    parts = body.split(b":", 2)
    return b"%s:%s:" % (parts[0], parts[1]) if len(parts) == 3 else body


def _at(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]
