"""`pinmq top`: a live view of one node's queues, rates, most lagging groups and stalled
consumers, refreshed until Ctrl-C.

It reads the node's own metrics (the Admin `Metrics` call: the text `GET /metrics` serves, so
`top` and Prometheus never disagree on a figure) over the client's connection, with the same
options as every verb. `build` turns two readings into a `View` (pure: rates are the counters'
growth between them); `render` draws it with rich; `run_top` polls. On a terminal the view
redraws in place; piped, each poll prints a plain frame. The first reading must come (else
the command fails with one line); a later one that fails keeps the last view on screen, marked
with when the node stopped answering, and polling goes on until it answers again.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from broker.client import Client, PinmqError
from pinmq.verbs import client_of, stdout_console

Labels = Mapping[str, str]
WAIT = "pinmq_queue_enqueue_to_first_delivery_seconds_bucket"
TO_ACK = "pinmq_queue_enqueue_to_ack_seconds_bucket"


@dataclass(frozen=True, slots=True)
class Reading:
    """One answer of the node: each sample name's (labels, value) pairs, and when it came."""

    taken: float  # time.monotonic(): rates divide by the time between two readings
    at: datetime  # the wall clock, to show
    samples: Mapping[str, list[tuple[Labels, float]]]

    @classmethod
    def parse(cls, text: str, taken: float, at: datetime) -> Reading:
        samples: dict[str, list[tuple[Labels, float]]] = defaultdict(list)
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[s.name].append((s.labels, s.value))
        return cls(taken, at, dict(samples))

    def per_queue(self, name: str) -> dict[str, float]:
        return {labels["queue"]: value for labels, value in self.samples.get(name, ())}

    def total(self, name: str) -> float | None:
        """The sum of a metric's samples (None: the node has no such series)."""
        found = self.samples.get(name)
        return sum(value for _, value in found) if found else None


@dataclass(frozen=True, slots=True)
class QueueRow:
    queue: str
    pending: int
    in_flight: int
    consumers: int
    owned: int  # groups pinned to a consumer
    waiting: int  # groups with messages waiting and no consumer
    held: int  # groups held while the node confirms their binding
    in_per_s: float | None  # None: no earlier reading to compare with
    acked_per_s: float | None
    wait_p50: tuple[float, float] | None  # (low, high]: the bucket of the median wait
    ack_p50: tuple[float, float] | None  # the same, from enqueue to ack


@dataclass(frozen=True, slots=True)
class GroupRow:
    queue: str
    group: str
    owner: str | None  # its consumer's name
    held: bool
    backlog: int | None  # None: not among the queue's top groups by backlog
    oldest_s: float | None  # None: not among the top groups by age (or its oldest is paged)


@dataclass(frozen=True, slots=True)
class StalledRow:
    queue: str
    consumer: str
    consumer_id: str
    unacked: int


@dataclass(frozen=True, slots=True)
class View:
    node: str
    at: datetime
    queues: list[QueueRow]
    groups: list[GroupRow]
    stalled: list[StalledRow]
    memory: tuple[float, float] | None  # (used, limit) bytes
    disk: tuple[float, float] | None  # (usage, limit) ratios
    peers: tuple[int, int] | None  # (linked, known); None when not clustered


def build(before: Reading | None, after: Reading, top: int) -> View:
    """What `top` shows of `after`; with `before`, the rates and latencies since then (else
    latencies since the node started). `top` caps the lagging groups of each ranking."""
    elapsed = after.taken - before.taken if before is not None else 0.0

    def rate(name: str) -> dict[str, float | None]:
        now = after.per_queue(name)
        then = before.per_queue(name) if before is not None and elapsed > 0 else {}
        return {q: _growth(then.get(q), value, elapsed) for q, value in now.items()}

    counts = {  # in QueueRow's order
        field: after.per_queue(f"pinmq_queue_{field}")
        for field in (
            "pending_messages",
            "in_flight_messages",
            "consumers",
            "groups_owned",
            "groups_unowned_waiting",
            "groups_held",
        )
    }
    entered = rate("pinmq_queue_enqueued_messages_total")
    acked = rate("pinmq_queue_acked_messages_total")
    waits = [(_histogram(after, name), _histogram(before, name)) for name in (WAIT, TO_ACK)]
    rows = [
        QueueRow(
            queue,
            *(int(counts[field].get(queue, 0)) for field in counts),
            entered.get(queue),
            acked.get(queue),
            *(_median(now.get(queue, {}), then.get(queue, {})) for now, then in waits),
        )
        for queue in counts["pending_messages"]
    ]
    rows.sort(key=lambda r: (-(r.pending + r.in_flight), r.queue))
    nodes = {labels["node"] for found in after.samples.values() for labels, _ in found}
    peers = after.samples.get("pinmq_peer_linked")
    return View(
        node=", ".join(sorted(nodes)) or "?",
        at=after.at,
        queues=rows,
        groups=_lagging(after, top),
        stalled=_stalled(after),
        memory=_pair(after, "pinmq_memory_used_bytes", "pinmq_memory_limit_bytes"),
        disk=_pair(after, "pinmq_disk_usage_ratio", "pinmq_disk_usage_limit_ratio"),
        peers=(int(sum(v for _, v in peers)), len(peers)) if peers else None,
    )


def _growth(then: float | None, now: float, elapsed: float) -> float | None:
    """A counter's growth per second; None without an earlier value or after a reset."""
    if then is None or now < then:
        return None
    return (now - then) / elapsed


def _pair(reading: Reading, first: str, second: str) -> tuple[float, float] | None:
    a, b = reading.total(first), reading.total(second)
    return (a, b) if a is not None and b is not None else None


def _histogram(reading: Reading | None, name: str) -> dict[str, dict[float, float]]:
    """A histogram's cumulative counts by upper bound, per queue (one pass over its series)."""
    buckets: dict[str, dict[float, float]] = defaultdict(dict)
    for labels, value in reading.samples.get(name, ()) if reading is not None else ():
        buckets[labels["queue"]][float(labels["le"])] = value
    return buckets


def _median(now: dict[float, float], then: dict[float, float]) -> tuple[float, float] | None:
    """The bucket (low, high] that holds the median of the counts between two readings of a
    queue's histogram (since the node started without `then`, or when its counts went back)."""
    if then and all(then.get(le, 0) <= count for le, count in now.items()):
        now = {le: count - then.get(le, 0) for le, count in now.items()}
    bounds = sorted(now)
    total = now[bounds[-1]] if bounds else 0
    if not total:
        return None
    # Counts are cumulative: the last bucket (+Inf) holds them all, so one is found.
    return next(
        (low, high)
        for low, high in zip([0.0, *bounds], bounds, strict=False)
        if now[high] >= total / 2
    )


def _lagging(reading: Reading, top: int) -> list[GroupRow]:
    """The `top` groups with the most messages waiting and the `top` whose oldest waited
    longest, across the queues, longest waiting first."""
    backlog: dict[tuple[str, str], float] = {}
    age: dict[tuple[str, str], float] = {}
    labels_of: dict[tuple[str, str], Labels] = {}
    for name, into in (
        ("pinmq_top_group_backlog_messages", backlog),
        ("pinmq_top_group_oldest_age_seconds", age),
    ):
        for labels, value in reading.samples.get(name, ()):
            key = (labels["queue"], labels["group"])
            into[key] = value
            labels_of[key] = labels
    chosen = dict.fromkeys(
        [
            *sorted(age, key=lambda k: -age[k])[:top],
            *sorted(backlog, key=lambda k: -backlog[k])[:top],
        ]
    )
    rows = [
        GroupRow(
            queue,
            group,
            labels_of[(queue, group)]["owner"] or None,
            labels_of[(queue, group)]["held"] == "true",
            int(backlog[(queue, group)]) if (queue, group) in backlog else None,
            age.get((queue, group)),
        )
        for queue, group in chosen
    ]
    rows.sort(
        key=lambda r: (r.oldest_s is None, -(r.oldest_s or 0), -(r.backlog or 0), r.queue, r.group)
    )
    return rows


def _stalled(reading: Reading) -> list[StalledRow]:
    unacked = {
        (labels["queue"], labels["consumer_id"]): value
        for labels, value in reading.samples.get("pinmq_consumer_unacked_messages", ())
    }
    rows = [
        StalledRow(
            labels["queue"],
            labels["consumer"],
            labels["consumer_id"],
            int(unacked.get((labels["queue"], labels["consumer_id"]), 0)),
        )
        for labels, value in reading.samples.get("pinmq_consumer_stalled", ())
        if value
    ]
    rows.sort(key=lambda r: (r.queue, r.consumer, r.consumer_id))
    return rows


# ---- drawing ---------------------------------------------------------------------------------


def render(view: View, every: float | None, stale: str | None = None) -> RenderableType:
    """The view as rich renders it: a header, then the queues, the groups, the consumers.
    `every`: how often it is redrawn (None: never again)."""
    again = "" if every is None else f", every {every:g} s (Ctrl-C quits)"
    facts = [f"pinmq top: {view.node} at {view.at:%H:%M:%S}{again}"]
    if view.memory is not None:
        facts.append(f"memory {_bytes(view.memory[0])} of {_bytes(view.memory[1])}")
    if view.disk is not None:
        facts.append(f"disk {view.disk[0]:.0%} (limit {view.disk[1]:.0%})")
    if view.peers is not None:
        facts.append(f"peers linked {view.peers[0]}/{view.peers[1]}")
    parts: list[RenderableType] = [Text(" | ".join(facts), style="bold")]
    if stale is not None:
        parts.append(Text(stale, style="bold red"))
    queues = Table(
        "queue", "pending", "in flight", "consumers", "groups owned/waiting/held",
        "in/s", "ack/s", "wait p50", "ack p50", title="queues", title_justify="left",
    )  # fmt: skip
    for q in view.queues:
        queues.add_row(
            q.queue,
            str(q.pending),
            str(q.in_flight),
            str(q.consumers),
            f"{q.owned}/{q.waiting}/{q.held}",
            _rate(q.in_per_s),
            _rate(q.acked_per_s),
            _bucket(q.wait_p50),
            _bucket(q.ack_p50),
        )
    groups = Table(
        "group", "queue", "owner", "held", "backlog", "oldest waits",
        title="most lagging groups", title_justify="left",
    )  # fmt: skip
    for g in view.groups:
        groups.add_row(
            g.group,
            g.queue,
            g.owner or "-",
            "yes" if g.held else "no",
            "-" if g.backlog is None else str(g.backlog),
            "-" if g.oldest_s is None else _duration(g.oldest_s),
        )
    parts += [queues, groups]
    if view.stalled:
        stalled = Table(
            "consumer", "queue", "unacked", title="stalled consumers", title_justify="left"
        )
        for c in view.stalled:
            stalled.add_row(f"{c.consumer} ({c.consumer_id})", c.queue, str(c.unacked))
        parts.append(stalled)
    else:
        parts.append(Text("no stalled consumer"))
    return Group(*parts)


def _rate(per_s: float | None) -> str:
    return "-" if per_s is None else f"{per_s:.1f}"


def _bucket(bounds: tuple[float, float] | None) -> str:
    if bounds is None:
        return "-"
    low, high = bounds
    return f"> {_duration(low)}" if math.isinf(high) else f"<= {_duration(high)}"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def _bytes(n: float) -> str:
    units = ("B", "KiB", "MiB", "GiB")
    unit = 0
    while n >= 1024 and unit < len(units) - 1:
        n, unit = n / 1024, unit + 1
    return f"{n:.1f} {units[unit]}"


# ---- polling ---------------------------------------------------------------------------------


async def _read(client: Client) -> Reading:
    return Reading.parse(await client.metrics_text(), time.monotonic(), datetime.now())


async def _frames(client: Client, args: argparse.Namespace) -> AsyncIterator[RenderableType]:
    """A frame per poll: `args.iterations` of them, or until cancelled."""
    every = None if args.iterations == 1 else args.every
    before = await _read(client)  # no first answer: the command fails
    view = build(None, before, args.groups)
    yield render(view, every)
    since: datetime | None = None  # when the node stopped answering
    more = itertools.count() if args.iterations is None else range(args.iterations - 1)
    for _ in more:
        await asyncio.sleep(args.every)
        try:
            after = await _read(client)
        except PinmqError as err:
            since = since or datetime.now()
            yield render(view, every, f"node stopped answering since {since:%H:%M:%S}: {err}")
            continue
        since = None
        view = build(before, after, args.groups)
        before = after
        yield render(view, every)


async def run_top(args: argparse.Namespace) -> None:
    """`pinmq top`: redraw in place on a terminal, else print each frame."""
    async with client_of(args) as client:
        frames = _frames(client, args)
        if not sys.stdout.isatty():
            console = stdout_console()
            async for frame in frames:
                console.print(frame)
                console.line()  # a blank line between frames
            return
        with Live(console=Console(), auto_refresh=False) as live:
            async for frame in frames:
                live.update(frame, refresh=True)
