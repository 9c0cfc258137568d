"""How fast a snapshot streams to a backup that catches up: as fast as the primary's own
latency allows. Pure: the replication shell (cluster/replication.py) tells it how late the
primary's event loop ran and how long its store's commits took, and asks it how long to wait
before the next frame.

Why latency, not a fixed rate: a snapshot competes with the primary's live service for the
same cores and disk (reading and encoding rows on the primary, inserting and syncing them on
the backup). No rate suits every machine and load: an idle primary should send as fast as it
can, a busy one only what its clients do not notice. Each budget is set from the primary's
own figure just before the snapshot began, so its clients' latency stays within a small
multiple of what it was. Means are compared, the figure since the last frame against the
figure before the snapshot: a loop under live load runs late by a few ms now and then,
snapshot or not, and the worst of a window would always exceed a typical figure.

The wait grows by doubling while either figure is over budget and shrinks by halving once
both are back within it (a backup on an idle primary gets the snapshot at full speed); as it
grows, a frame's own cost is spread over more of the primary's time, so the snapshot settles
at the share the budgets leave it.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOOR_MS = 2.0  # a budget below this would throttle on scheduler noise alone
FACTOR = 1.5  # a budget: this many times the primary's mean figure before the snapshot
MIN_WAIT_MS = 1.0  # the first step of a wait, and below which a wait ends
MAX_WAIT_MS = 500.0  # at most this between frames: the snapshot always progresses


@dataclass
class Latency:
    """One of the primary's latencies: its budget, and what was seen since the last frame."""

    budget_ms: float
    total_ms: float = 0.0
    seen: int = 0

    @classmethod
    def from_baseline(cls, total_ms: float, seen: int) -> Latency:
        """A budget of `FACTOR` times the mean before the snapshot (`total_ms` over `seen`
        samples), at least `FLOOR_MS`."""
        mean = total_ms / seen if seen else 0.0
        return cls(budget_ms=max(FLOOR_MS, FACTOR * mean))

    def observe(self, total_ms: float, seen: int = 1) -> None:
        self.total_ms += total_ms
        self.seen += seen

    def over(self) -> bool:
        return self.seen > 0 and self.total_ms / self.seen > self.budget_ms

    def clear(self) -> None:
        self.total_ms, self.seen = 0.0, 0


@dataclass
class CatchupPace:
    """The wait between snapshot frames: the event loop's lateness and the store's commits."""

    loop: Latency
    commits: Latency
    wait_ms: float = 0.0

    def next_wait_s(self) -> float:
        """After a frame: seconds to wait before the next, from the figures since the frame
        before (doubling while one is over budget, halving once both are within it)."""
        if self.loop.over() or self.commits.over():
            self.wait_ms = min(MAX_WAIT_MS, max(2 * self.wait_ms, MIN_WAIT_MS))
        else:
            half = self.wait_ms / 2
            self.wait_ms = half if half >= MIN_WAIT_MS else 0.0
        self.loop.clear()
        self.commits.clear()
        return self.wait_ms / 1000
