"""Part 5 of bench/security.py: a burst of wrong passwords beside a steady client.

STOMP CONNECTs with a wrong passcode from concurrent TLS sockets (a process of its own) while a
connected gRPC client of the secure node sends and consumes: that client's msg/s during the
burst against before and after it, how long the node took to refuse the whole burst, how its
answers spread in time (broker/login_queue.py: the node refuses a host's password checks at
once beyond `PER_HOST` waiting, or once the host has used its budget of failures; the others
wait for its one argon2 thread), and whether a right password, tried every half second
meanwhile, gets in.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import ssl
import statistics
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.clients import Plan, group_name
from harness.load import PREFETCH
from harness.procs import NodeCpu, die_with_parent, end_workers, next_event_async, node_cpu
from harness.stats import pct

from broker.client import Client
from broker.login_queue import PER_HOST
from broker.users import Users
from security_parts.connection_setup import stomp_connect
from security_parts.variants import GROUPS, USER, Variant

START_TIMEOUT_S = 30.0  # the burst process ready
STEADY_CHUNK = 500  # messages per send_many call of the steady client (batches of 100)
STEADY_AHEAD = 2_000  # messages the steady client's producer may be ahead of its consumer
SAMPLE_S = 0.2  # how often the node's CPU is read during a burst


def burst_main(
    host: str,
    port: int,
    ca: str,
    count: int,
    concurrency: int,
    go: Any,
    events: Any,
) -> None:
    """`count` STOMP CONNECTs with a wrong passcode over TLS, `concurrency` sockets at a time,
    on `go`; reports (monotonic start, connect s, answer s, answer) per attempt, and the CPU
    seconds this process used (it shares the machine with the node and the steady client)."""
    die_with_parent()
    context = ssl.create_default_context(cafile=ca)
    login = (USER, "not-the-password")

    def attempt(_: int) -> tuple[float, float, float, str]:
        start = time.monotonic()
        try:
            return (start, *stomp_connect(host, port, context, login))
        except OSError as err:
            return start, 0.0, time.monotonic() - start, type(err).__name__

    events.put(("ready", "burst"))
    if not go.wait(120):
        raise TimeoutError("burst: no go")
    cpu0 = time.process_time()
    with ThreadPoolExecutor(concurrency) as pool:
        attempts = list(pool.map(attempt, range(count)))
    events.put(("burst", (attempts, time.process_time() - cpu0)))


def login_probe(variant: Variant, done: threading.Event) -> list[tuple[float, str]]:
    """Log in with the right password every half second until `done`: (answer s, answer)."""
    out = []
    while not done.is_set():
        try:
            login = variant.node.reach.login()
            _, answer_s, answer = stomp_connect(*variant.stomp, variant.context, login)
        except OSError as err:
            answer_s, answer = 0.0, type(err).__name__
        out.append((answer_s, answer))
        done.wait(0.5)
    return out


@dataclass(slots=True)
class Steady:
    """A connected client sending and consuming on one queue; delivery times and counts."""

    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, messages)
    sent: int = 0
    acked: int = 0

    def rate(self, start: float, end: float) -> float:
        return sum(k for t, k in self.arrivals if start <= t < end) / (end - start)


async def steady_load(client: Client, queue: str, stop: asyncio.Event, steady: Steady) -> None:
    """Persistent grouped messages (100 groups) sent and consumed with acks until `stop`,
    the producer at most STEADY_AHEAD messages ahead of the consumer."""
    producer = client.producer(queue, persistent=True)
    consumer = client.consumer(queue, name="steady", prefetch=PREFETCH)
    await consumer.start()
    items = Plan(client.target, "", 0, 10**12, tuple(group_name(g) for g in range(GROUPS))).items()
    room = asyncio.Condition()

    async def produce() -> None:
        while not stop.is_set():
            async with room:
                await room.wait_for(lambda: steady.sent - steady.acked < STEADY_AHEAD)
            await producer.send_many(itertools.islice(items, STEADY_CHUNK), batch_size=100)
            steady.sent += STEADY_CHUNK

    async def consume() -> None:
        while not stop.is_set() or steady.acked < steady.sent:
            m = await consumer.receive(0.05)
            if m is None:
                continue
            batch = [m]
            while (m := await consumer.receive(0)) is not None:
                batch.append(m)
            steady.arrivals.append((time.monotonic(), len(batch)))
            await consumer.ack_many(batch)
            steady.acked += len(batch)
            async with room:
                room.notify_all()

    await asyncio.gather(produce(), consume())
    await consumer.close()


@dataclass(slots=True)
class Burst:
    """One burst's figures. Windows: before the burst, its first phase (until 90 % of the
    attempts were answered: TLS handshakes and refusals), the rest (the node works through the
    checks that were let wait) and after it."""

    rates: dict[str, float]  # window -> the steady client's msg/s
    cpu: dict[str, tuple[float, float]]  # window -> (node cores, event-loop cores)
    during: float  # the steady client's msg/s over the whole burst
    seconds: float  # go -> the last answer
    first_s: float  # go -> 90 % answered
    answers: dict[str, int]
    waits: list[float]  # seconds from CONNECT to the answer, sorted
    generator_cpu: float  # CPU seconds of the burst process (on this same machine)
    logins: list[tuple[float, str]]  # right-password logins tried during the burst

    @property
    def ratio(self) -> float:
        return self.during / ((self.rates["before"] + self.rates["after"]) / 2)


def argon2_seconds(users_file: Path, times: int = 3) -> float:
    """Median seconds of one wrong-password check, as the node's login thread does it."""
    users = Users(users_file)
    spent = []
    for _ in range(times):
        t = time.perf_counter()
        users.authenticate(USER, "wrong")
        spent.append(time.perf_counter() - t)
    return statistics.median(spent)


def cores(
    samples: Sequence[tuple[float, NodeCpu]], start: float, end: float
) -> tuple[float, float]:
    """(node cores, event-loop cores) between the first and last samples in [start, end]
    (zeros when fewer than two fall inside)."""
    inside = [x for x in samples if start <= x[0] <= end]
    if len(inside) < 2:
        return 0.0, 0.0
    (ta, a), (tb, b) = inside[0], inside[-1]
    return (b.total - a.total) / (tb - ta), (b.loop - a.loop) / (tb - ta)


async def burst(variant: Variant, count: int, concurrency: int, quiet_s: float) -> Burst:
    """The steady client on `variant` for quiet_s, then through a burst of `count` wrong
    passcodes (with a right one tried every half second meanwhile), then quiet_s more."""
    ctx = mp.get_context("spawn")
    events, go = ctx.Queue(), ctx.Event()
    host, port = variant.stomp
    tls = variant.node.reach.tls
    assert tls is not None
    args = (host, port, str(tls.ca), count, concurrency, go, events)
    proc = ctx.Process(target=burst_main, args=args, daemon=True)
    queue = f"burst-{uuid.uuid4().hex[:6]}"
    steady, stop, probed = Steady(), asyncio.Event(), threading.Event()
    samples: list[tuple[float, NodeCpu]] = []  # the node's CPU, every SAMPLE_S

    async def sample() -> None:
        while not stop.is_set():
            samples.append((time.monotonic(), node_cpu(variant.node.pid)))
            await asyncio.sleep(SAMPLE_S)

    try:
        proc.start()
        kind, _ = await next_event_async(events, [proc], START_TIMEOUT_S)
        assert kind == "ready", kind
        async with variant.node.client() as client:
            await client.create_queue(queue)
            tasks = [asyncio.create_task(steady_load(client, queue, stop, steady))]
            tasks.append(asyncio.create_task(sample()))
            await asyncio.sleep(1.0)  # warm-up
            t0 = time.monotonic()
            await asyncio.sleep(quiet_s)
            t1 = time.monotonic()
            go.set()
            logins = asyncio.create_task(asyncio.to_thread(login_probe, variant, probed))
            kind, (attempts, generator_cpu) = await next_event_async(events, [proc], 600)
            assert kind == "burst", kind
            t2 = time.monotonic()
            probed.set()
            await logins  # its last login may still wait for the node: not in the next window
            t3 = time.monotonic()
            await asyncio.sleep(quiet_s)
            t4 = time.monotonic()
            stop.set()
            await asyncio.gather(*tasks)
            await client.delete_queue(queue)
    finally:
        stop.set()
        probed.set()
        end_workers([proc], events)
    answers: dict[str, int] = {}
    for *_, answer in attempts:
        answers[answer] = answers.get(answer, 0) + 1
    answered = sorted(start + a + b for start, a, b, _ in attempts)
    t90 = pct(answered, 0.9)
    windows = {"before": (t0, t1), "first": (t1, t90), "rest": (t90, t2), "after": (t3, t4)}
    return Burst(
        rates={k: steady.rate(a, b) for k, (a, b) in windows.items()},
        cpu={k: cores(samples, a, b) for k, (a, b) in windows.items()},
        during=steady.rate(t1, t2),
        seconds=answered[-1] - t1,
        first_s=t90 - t1,
        answers=answers,
        waits=sorted(b for _, _, b, _ in attempts),
        generator_cpu=generator_cpu,
        logins=logins.result(),
    )


def print_burst(index: int, b: Burst, count: int, concurrency: int, argon2_s: float) -> None:
    """The summary's lines of burst `index` (of `count` attempts, `concurrency` at a time)."""
    print(
        f"\nburst {index}: {count:,} STOMP CONNECTs with a wrong passcode over TLS, "
        f"{concurrency} sockets at a time (a process of its own), beside a connected gRPC "
        f"client of the TLS + security node ({GROUPS} groups persistent, send_many + ack_many)"
    )
    r = b.rates
    print(
        f"  steady client msg/s: before {r['before']:,.0f}, during {b.during:,.0f}, after "
        f"{r['after']:,.0f}; during / mean(before, after) = {b.ratio:.2f}"
    )
    print(
        f"    during the first {b.first_s:.1f} s (until 90 % were answered) "
        f"{r['first']:,.0f}, the remaining {b.seconds - b.first_s:.1f} s {r['rest']:,.0f}"
    )
    print(
        f"  whole burst refused in {b.seconds:.1f} s (go -> last answer); answers "
        f"{b.answers}; the burst process used {b.generator_cpu:.1f} CPU s"
    )
    edges = (0.0, 0.1, 0.5, 1.0, 5.0, float("inf"))
    spans = [
        f"{sum(lo <= w < hi for w in b.waits)} in {lo:g}-{hi:g} s"
        for lo, hi in itertools.pairwise(edges)
    ]
    print(f"  CONNECT -> answer: {', '.join(spans).replace('-inf s', ' s or more')}")
    waited = sum(w >= 1.0 for w in b.waits)  # far beyond the loop's delays: they queued
    most = min(count, round(b.seconds / argon2_s))
    print(
        f"  checked (argon2) by the node's one login thread: at least {waited} (answered "
        f"after 1 s or more: they waited for it), at most {most} (the burst's length over "
        f"one check here, {argon2_s * 1e3:.0f} ms); the other {count - most}-"
        f"{count - waited} refused at once ({PER_HOST} checks waiting already)"
    )
    ok = sum(answer == "CONNECTED" for _, answer in b.logins)
    waits = sorted(w for w, _ in b.logins)
    print(
        f"  right-password logins tried every 0.5 s during the burst: {ok} of "
        f"{len(b.logins)} CONNECTED (median answer {statistics.median(waits) * 1e3:.0f} ms, "
        f"max {waits[-1] * 1e3:.0f} ms)"
        if waits
        else "  no right-password login tried"
    )
    cpu = ", ".join(f"{k} {t:.2f} ({lp:.2f})" for k, (t, lp) in b.cpu.items())
    print(f"  node cores busy (of which its event loop): {cpu}")
