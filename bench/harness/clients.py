"""Client processes of a load run: producers that stream a plan, consumers that record arrivals.

Each runs in a spawned process with its own `broker.client.Client` (TLS and a login as its
node's `Reach` says), reports "ready" on the shared event queue, and (producers) waits for the
go event, so that connection set-up, a password check included, stays outside the timed
region. Bodies carry send time, producer and sequence, so consumers measure latency and the
parent checks exactly-once and order from what they report.
"""

from __future__ import annotations

import asyncio
import signal
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from broker.client import Consumer, Received
from broker.message import GROUP_ID_HEADER, GROUP_SEQ_HEADER
from harness.procs import IDLE, MachineCpu, NodeCpu, die_with_parent, machine_cpu, node_cpu
from harness.reach import Reach

BODY_BYTES = 100  # time_ns (8 B) + producer (2 B) + sequence (4 B) + padding
POLL_S = 0.05  # how often an idle consumer checks whether the run is over
STALL_S = 30.0  # a run with no ack anywhere for this long has failed
LINGER_S = 0.5  # after the run, how long consumers wait for (unexpected) redeliveries
RUN_TIMEOUT_S = 600.0
PAD_KEY_HEADER = "x-bench-tag"  # as long as JMSXGroupID
PAD_SEQ_HEADER = "x-bench-step"  # as long as JMSXGroupSeq


def group_name(g: int) -> str:
    return f"g{g:05d}"


_BODY = struct.Struct(f"<QHI{BODY_BYTES - 14}x")  # send time_ns, producer, seq, padding


def encode(producer: int, seq: int) -> bytes:
    """A body: send time, producer index, sequence number, padding to BODY_BYTES."""
    return _BODY.pack(time.time_ns(), producer, seq)


def decode(body: bytes) -> tuple[int, int, int]:
    """(send time ns, producer, seq) from a body made by `encode`."""
    return _BODY.unpack_from(body)  # type: ignore[return-value]


@dataclass(slots=True, frozen=True)
class Plan:
    """What one producer sends: message i (seq i + 1) goes to groups[(i + offset) % len]."""

    url: str
    node_id: str
    index: int
    count: int
    groups: tuple[str, ...]  # empty: ungrouped
    offset: int = 0
    # Ungrouped messages carry two headers shaped like JMSXGroupID / JMSXGroupSeq, so that a
    # grouped-vs-ungrouped comparison measures routing, not the cost of carrying headers.
    pad: bool = False

    def group_of(self, seq: int) -> str | None:
        if not self.groups:
            return None
        return self.groups[(seq - 1 + self.offset) % len(self.groups)]

    def items(self) -> Iterator[tuple[bytes, dict[str, str]]]:
        """The messages as (body, headers), each body stamped as it is built."""
        groups, offset, index = self.groups, self.offset, self.index
        sent = [0] * len(groups)  # JMSXGroupSeq counts within each group, as a producer's would
        for seq in range(1, self.count + 1):
            if groups:
                at = (seq - 1 + offset) % len(groups)
                sent[at] += 1
                headers = {GROUP_ID_HEADER: groups[at], GROUP_SEQ_HEADER: str(sent[at])}
            elif self.pad:
                headers = {PAD_KEY_HEADER: group_name(seq % 100), PAD_SEQ_HEADER: str(seq)}
            else:
                headers = {}
            yield encode(index, seq), headers


def producer_main(
    plan: Plan,
    reach: Reach,
    address: str,
    persistent: bool,
    batch_size: int,
    window: int,
    events: Any,
    go: Any,
) -> None:
    """Connect, report ready, wait for `go`, stream the plan's messages; report times and CPU."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us

    async def run() -> None:
        async with reach.client(plan.url) as client:
            await reach.log_in(client)
            producer = client.producer(address, persistent=persistent)
            events.put(("ready", f"producer {plan.index}"))
            await asyncio.to_thread(go.wait, RUN_TIMEOUT_S)
            cpu0, first = time.process_time(), time.time_ns()
            ids = await producer.send_many(plan.items(), batch_size=batch_size, window=window)
            done = time.time_ns()
            report = {
                "index": plan.index,
                "first_ns": first,
                "done_ns": done,
                "sent": len(ids),
                "cpu": time.process_time() - cpu0,
            }
            events.put(("producer", report))

    asyncio.run(run())


@dataclass(slots=True)
class Seen:
    """What one consumer received, in arrival order (parallel lists)."""

    name: str
    node_id: str
    groups: list[str] = field(default_factory=list)
    producers: list[int] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    latency_ns: list[int] = field(default_factory=list)
    arrivals: list[tuple[int, int]] = field(default_factory=list)  # (time_ns, batch size)
    redelivered: int = 0
    extra: int = 0  # deliveries that arrived after all were acked
    end_ns: int = 0  # set by the consumer that acked the last message: its receipt time
    node_cpu_end: list[NodeCpu] = field(default_factory=list)
    machine_end: MachineCpu = IDLE

    def record(self, batch: list[Received], now: int) -> None:
        self.arrivals.append((now, len(batch)))
        for m in batch:
            sent, producer, seq = decode(m.body)
            self.groups.append(m.group_id or "")
            self.producers.append(producer)
            self.seqs.append(seq)
            self.latency_ns.append(now - sent)
            if m.delivery_count != 1:
                self.redelivered += 1


async def _consume(
    consumer: Consumer, seen: Seen, total: int, acked: Any, node_pids: list[int]
) -> None:
    """Receive and ack (batched) until `total` messages are acked across all consumers.

    `acked` is a shared counter; the consumer whose batch takes it to `total` asks for the
    ack's receipt and records the end time and the nodes' CPU.
    """
    lock = acked.get_lock()
    progress, stalled_since = 0, time.monotonic()
    while True:
        m = await consumer.receive(POLL_S)
        if m is None:
            count = acked.value
            if count >= total:
                break
            if count != progress:
                progress, stalled_since = count, time.monotonic()
            elif time.monotonic() - stalled_since > STALL_S:
                return  # the parent reports the stall
            continue
        now = time.time_ns()
        batch = [m]
        while (m := await consumer.receive(0)) is not None:
            batch.append(m)
        seen.record(batch, now)
        with lock:
            before = acked.value
            acked.value = before + len(batch)
        last = before < total <= before + len(batch)
        await consumer.ack_many(batch, wait=last)
        if last:
            seen.end_ns = time.time_ns()
            seen.node_cpu_end = [node_cpu(p) for p in node_pids]
            seen.machine_end = machine_cpu()
            break
    # Anything arriving now would be a redelivery or a duplicate: count it, then stop.
    while (m := await consumer.receive(LINGER_S)) is not None:
        seen.record([m], time.time_ns())
        seen.extra += 1
        await consumer.ack_many([m])


def consumer_main(
    url: str,
    reach: Reach,
    node_id: str,
    queue: str,
    names: list[str],
    prefetch: int,
    total: int,
    acked: Any,
    node_pids: list[int],
    events: Any,
) -> None:
    """Host the consumers `names` on one node (one client): subscribe, report ready, consume."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us

    async def run() -> None:
        async with reach.client(url) as client:
            await reach.log_in(client)
            consumers = [client.consumer(queue, name=n, prefetch=prefetch) for n in names]
            for c in consumers:
                await c.start()
            cpu0 = time.process_time()
            events.put(("ready", ",".join(names)))
            seen = [Seen(n, node_id) for n in names]
            await asyncio.gather(
                *(
                    _consume(c, s, total, acked, node_pids)
                    for c, s in zip(consumers, seen, strict=True)
                )
            )
            cpu = time.process_time() - cpu0  # includes the linger wait, which is idle
            for c in consumers:
                await c.close()
            events.put(("consumers", {"seen": seen, "cpu": cpu}))

    asyncio.run(run())
