"""The primary's own latency while it streams a snapshot (`cluster/snapshot_pace.py` decides
from it): how late its event loop runs a timer, and how long its store takes to commit."""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

from broker.histogram import Histogram
from cluster.snapshot_pace import Latency

TICK_S = 0.005  # the timer whose lateness is measured


class LatencyProbe:
    """Means since the last `take`; a ticker task runs while it is entered."""

    def __init__(self, commits: Histogram | None) -> None:
        self._commits = commits  # the store's commit times (ns), as /metrics reads them
        self._late_s = 0.0
        self._ticks = 0
        self._seen = self._commit_totals()
        self._ticking: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LatencyProbe:
        self._ticking = asyncio.create_task(self._tick(), name="latency-probe")
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._ticking is not None:
            self._ticking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticking

    def take(self) -> Latency:
        loop_s = self._late_s / self._ticks if self._ticks else 0.0
        self._late_s, self._ticks = 0.0, 0
        count, total = self._commit_totals()
        commits = count - self._seen[0]
        commit_s = (total - self._seen[1]) / commits / 1e9 if commits else 0.0
        self._seen = count, total
        return Latency(loop_s, commit_s)

    def _commit_totals(self) -> tuple[int, int]:
        commits = self._commits
        return (0, 0) if commits is None else (commits.count, commits.sum)

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            await asyncio.sleep(TICK_S)
            self._late_s += max(0.0, loop.time() - asked - TICK_S)
            self._ticks += 1
