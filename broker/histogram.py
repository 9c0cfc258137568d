"""A histogram of counts per bucket, kept where things happen and read by /metrics.

Prometheus histograms are cumulative counts per upper bound plus a sum; this keeps a count per
bucket (one list increment per observation) and leaves the cumulation to the reader
(`pinmq/queue_metrics.py` renders them), so observing stays cheap on a hot path.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence


class Histogram:
    """Counts per bucket of `bounds` (ascending upper bounds; the last bucket: above them)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[int]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0

    def observe(self, value: int) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self, scale: float = 1.0) -> list[tuple[str, float]]:
        """(upper bound divided by `scale`, observations at or under it), "+Inf" last: the
        buckets of a Prometheus histogram, in its base unit."""
        out, total = [], 0
        for bound, count in zip((*self.bounds, None), self.counts, strict=True):
            total += count
            out.append(("+Inf" if bound is None else repr(bound / scale), total))
        return out
