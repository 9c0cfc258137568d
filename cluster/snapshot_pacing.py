"""The shell of a snapshot's pace (cluster/catchup_pace.py) on the primary: what it measures
of this process, the event loop's lateness (a probe task) and the message store's commit
times (its histogram), before the snapshot to set the budgets and during it to pace frames.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from broker.histogram import Histogram
from cluster.catchup_pace import CatchupPace, Latency

PROBE_S = 0.005  # the loop-lateness probe's period while a snapshot streams
BASELINE_S = 0.25  # the primary's latencies measured this long before a snapshot begins


class SnapshotPacer:
    """Measures, then paces: `await start()` before the first frame, `pause()` after each
    (the seconds to wait), `stop()` when the snapshot is sent or abandoned."""

    def __init__(self, commits: Histogram | None) -> None:
        self._commits = commits
        self._probe: asyncio.Task[None] | None = None
        self._seen = self._commit_totals()
        self.pace: CatchupPace | None = None

    async def start(self) -> None:
        lateness = Latency(0.0)
        self._probe = asyncio.ensure_future(_probe_lag(lateness.observe))
        self._seen = self._commit_totals()
        await asyncio.sleep(BASELINE_S)
        commits = Latency.from_baseline(*self._commits_since())
        self.pace = CatchupPace(Latency.from_baseline(lateness.total_ms, lateness.seen), commits)
        self._probe.cancel()
        self._probe = asyncio.ensure_future(_probe_lag(self.pace.loop.observe))

    def pause(self) -> float:
        """After a frame: the seconds to wait before the next."""
        assert self.pace is not None, "start() first"
        self.pace.commits.observe(*self._commits_since())
        return self.pace.next_wait_s()

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.cancel()

    def _commit_totals(self) -> tuple[int, int]:
        h = self._commits
        return (h.sum, h.count) if h is not None else (0, 0)

    def _commits_since(self) -> tuple[float, int]:
        """The commit time (ms) and commits since the last call."""
        (total, count), (before, before_count) = self._commit_totals(), self._seen
        self._seen = (total, count)
        return (total - before) / 1e6, count - before_count


async def _probe_lag(observe: Callable[[float], None]) -> None:
    """Tells `observe` how late (ms) the event loop wakes a task every `PROBE_S`: the delay
    every client of this process sees on top of its own work."""
    loop = asyncio.get_running_loop()
    while True:
        began = loop.time()
        await asyncio.sleep(PROBE_S)
        observe((loop.time() - began - PROBE_S) * 1000)
