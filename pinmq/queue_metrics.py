"""The per-queue part of `GET /metrics`: figures, totals, latencies, the most lagging groups
and the consumers (`pinmq/metrics.py` adds the node, the cluster and ha).

Everything here is read from what the queue keeps as messages move (`QueueCounts`,
`QueueTotals`, `Queue.lagging`): a scrape costs one pass over the queues, their consumers and
`top-groups` candidates per queue, never a walk of the groups. Groups are named only in the
top lists, so a million groups make no million series.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from broker.engine import QueueView
from broker.histogram import Histogram
from broker.info import LaggingGroup, QueueCounts
from broker.queue_stats import NS_PER_S

# (metric, help, the field of the queue's counts: `broker/info.py`'s QueueCounts).
QUEUE_GAUGES = (
    ("pinmq_queue_pending_messages", "Messages waiting for delivery, paged included.", "pending"),
    ("pinmq_queue_in_flight_messages", "Messages delivered and not yet settled.", "in_flight"),
    ("pinmq_queue_paged_messages", "Messages held on disk only (address full, PAGE).", "paged"),
    ("pinmq_queue_consumers", "Consumers subscribed to the queue.", "consumers"),
    ("pinmq_queue_groups", "Groups in the queue's group table.", "groups"),
    ("pinmq_queue_groups_owned", "Groups pinned to a consumer.", "owned"),
    (
        "pinmq_queue_groups_unowned_waiting",
        "Groups with messages waiting and no consumer yet (held ones included).",
        "unowned_waiting",
    ),
    (
        "pinmq_queue_groups_held",
        "Groups held while the node confirms where they are bound.",
        "held",
    ),
    (
        "pinmq_queue_memory_bytes",
        "What the queue's messages in memory count for, delivered or not.",
        "memory_bytes",
    ),
    (
        "pinmq_queue_in_flight_bytes",
        "What its delivered, unsettled messages count for.",
        "in_flight_bytes",
    ),
)
# (metric, help, the field of the queue's totals: `broker/queue_stats.py`'s QueueTotals).
QUEUE_COUNTERS = (
    ("pinmq_queue_enqueued_messages", "Messages that entered the queue.", "enqueued"),
    ("pinmq_queue_delivered_messages", "Deliveries, redeliveries included.", "delivered"),
    ("pinmq_queue_redelivered_messages", "Deliveries of a message sent before.", "redelivered"),
    ("pinmq_queue_acked_messages", "Messages acknowledged.", "acked"),
    (
        "pinmq_queue_dead_lettered_messages",
        "Messages rejected or past max-delivery-attempts: dead-lettered or dropped.",
        "dead_lettered",
    ),
)
QUEUE_LATENCIES = (
    (
        "pinmq_queue_enqueue_to_first_delivery_seconds",
        "From a message's enqueue to its first delivery.",
        "to_first_delivery",
    ),
    ("pinmq_queue_enqueue_to_ack_seconds", "From a message's enqueue to its ack.", "to_ack"),
)
TOP_LABELS = ("node", "queue", "group", "owner", "held")


def queue_metrics(
    node: str,
    queues: Sequence[QueueView],
    counts: Mapping[str, QueueCounts],
    top_groups: int,
    now_ns: int,
) -> Iterator[Metric]:
    """Every family of the queues (a family with no queue still says what it is); `counts`:
    each queue's counts, read once for the whole scrape."""
    labels = ("node", "queue")
    rows = [((node, q.name), counts[q.name]) for q in queues]
    for name, doc, field in QUEUE_GAUGES:
        family = GaugeMetricFamily(name, doc, labels=labels)
        for values, c in rows:
            family.add_metric(values, getattr(c, field))
        yield family
    age = GaugeMetricFamily(
        "pinmq_queue_oldest_message_age_seconds",
        "How long its oldest message in memory, waiting or delivered and unsettled, has been "
        "in the queue (0: none).",
        labels=labels,
    )
    for values, c in rows:
        age.add_metric(values, age_s(c.oldest_ns, now_ns))
    yield age
    for name, doc, field in QUEUE_COUNTERS:
        counter = CounterMetricFamily(name, doc, labels=labels)
        for q in queues:
            counter.add_metric((node, q.name), getattr(q.totals, field))
        yield counter
    for name, doc, field in QUEUE_LATENCIES:
        histogram = HistogramMetricFamily(name, doc, labels=labels)
        for q in queues:
            latency: Histogram = getattr(q.totals, field)
            buckets = latency.cumulative(NS_PER_S)
            histogram.add_metric((node, q.name), buckets, latency.sum / NS_PER_S)
        yield histogram
    yield from _top(node, queues, top_groups, now_ns)
    yield from _consumers(node, queues, now_ns)


def _top(node: str, queues: Sequence[QueueView], k: int, now_ns: int) -> Iterator[Metric]:
    backlog = GaugeMetricFamily(
        "pinmq_top_group_backlog_messages",
        "The metrics.top-groups groups of each queue with the most messages waiting.",
        labels=TOP_LABELS,
    )
    age = GaugeMetricFamily(
        "pinmq_top_group_oldest_age_seconds",
        "The metrics.top-groups groups of each queue whose oldest waiting message (in "
        "memory) waited longest, and how long.",
        labels=TOP_LABELS,
    )
    for q in queues if k else ():
        by_backlog, by_age = q.lagging(k)
        for row, values in _rows(node, q.name, by_backlog):
            backlog.add_metric(values, row.backlog)
        for row, values in _rows(node, q.name, by_age):
            age.add_metric(values, age_s(row.oldest_ns, now_ns))
    yield backlog
    yield age


def age_s(since_ns: int, now_ns: int) -> float:
    """Seconds from `since_ns` to `now_ns` (0 when `since_ns` is 0: nothing to age)."""
    return max(0, now_ns - since_ns) / NS_PER_S if since_ns else 0.0


def _rows(
    node: str, queue: str, rows: Iterable[LaggingGroup]
) -> Iterator[tuple[LaggingGroup, tuple[str, ...]]]:
    for row in rows:
        yield row, (node, queue, row.group, row.owner_name or "", str(row.held).lower())


def _consumers(node: str, queues: Sequence[QueueView], now_ns: int) -> Iterator[Metric]:
    labels = ("node", "queue", "consumer", "consumer_id")
    unacked = GaugeMetricFamily(
        "pinmq_consumer_unacked_messages", "Messages delivered to it, not settled.", labels=labels
    )
    stalled = GaugeMetricFamily(
        "pinmq_consumer_stalled",
        "1 while it holds messages and settled none for slow-consumer-threshold: it gets no "
        "new group.",
        labels=labels,
    )
    delivered = CounterMetricFamily(
        "pinmq_consumer_delivered_messages", "Deliveries to it.", labels=labels
    )
    acked = CounterMetricFamily("pinmq_consumer_acked_messages", "Its acks.", labels=labels)
    for q in queues:
        for c in q.consumers(now_ns):
            values = (node, q.name, c.name, c.consumer_id)
            unacked.add_metric(values, c.unacked)
            stalled.add_metric(values, int(c.stalled_ms > 0))
            delivered.add_metric(values, c.delivered)
            acked.add_metric(values, c.acked)
    yield from (unacked, stalled, delivered, acked)
