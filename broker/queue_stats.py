"""What a queue counts as messages move, for metrics: totals and latency histograms.

The dispatch steps bump these (an int add, and for a latency a bisect over ten bounds,
inlined there), so a scrape (`pinmq/metrics.py`) reads figures that are already there instead
of walking messages or groups. Pure: the times are the ones the queue is handed.
"""

from __future__ import annotations

from broker.histogram import Histogram

NS_PER_S = 1_000_000_000
# Upper bounds of the latency buckets, in ns: from a millisecond (a consumer keeping up) to
# ten minutes (a group stuck behind a slow owner, or waiting for its node to come back).
LATENCY_BOUNDS_NS = tuple(
    int(s * NS_PER_S) for s in (0.001, 0.005, 0.025, 0.1, 0.5, 1, 5, 30, 120, 600)
)


def latency() -> Histogram:
    """Durations in ns, in the LATENCY_BOUNDS_NS buckets."""
    return Histogram(LATENCY_BOUNDS_NS)


class QueueTotals:
    """Counted since the node started: what came in, went out, came back or died. The
    deliveries and acks are the histograms' counts: one count less per message."""

    __slots__ = ("dead_lettered", "enqueued", "redelivered", "to_ack", "to_first_delivery")

    def __init__(self) -> None:
        self.enqueued = 0
        self.redelivered = 0  # deliveries of a message delivered before
        self.dead_lettered = 0  # rejected, or returned once too often (max-delivery-attempts)
        self.to_first_delivery = latency()  # from enqueue to the message's first delivery
        self.to_ack = latency()  # from enqueue to its ack

    @property
    def delivered(self) -> int:
        """Every delivery, redeliveries included."""
        return self.to_first_delivery.count + self.redelivered

    @property
    def acked(self) -> int:
        return self.to_ack.count
