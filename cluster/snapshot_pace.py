"""How fast a snapshot streams to a backup that catches up: as fast as the primary's own
latency allows, and never slower than a floor.

Streaming a snapshot costs the primary CPU (reading and encoding rows) and, where the backup
shares its machine or disk, commit time; clients of the primary pay for it in latency. So the
stream takes a share of the wall time: after each step (a chunk read, encoded and written) it
rests `worked * (1 - share) / share`. The share halves, down to `FLOOR`, each step the
primary's latency (its event loop's lateness, its store's commit time) is over budget, and
grows back by `RISE` each step it is within. The budget is `BUDGET` times the latency the
primary had before the snapshot began, at least `LEAST_BUDGET_S`.

The floor is what keeps catch-up bounded: a primary that stays busy still gives the snapshot
a quarter of the time, so a catch-up takes at most 1 / FLOOR times as long as unpaced. And
pacing stops while the writes queued behind the snapshot pass `HURRY_BYTES`: a backup dropped
for falling too far behind would start again from nothing.

Pure: the shell (`cluster/replication.py`) measures and sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOOR = 0.25  # the snapshot's least share of the wall time
RISE = 0.1  # the share's growth per step within budget
BUDGET = 1.5  # latency up to this many times its level before the snapshot is within budget
LEAST_BUDGET_S = 0.002
HURRY_BYTES = 64 * 1024 * 1024  # queued writes past this: no rest (a quarter of the drop limit)


@dataclass(frozen=True)
class Latency:
    """The primary's latency over a while: means, in seconds."""

    loop_s: float  # how late its event loop ran a timer
    commit_s: float  # how long its store took to commit a write (0: no commits)


class Pace:
    """The snapshot's share of the wall time, from the primary's latency (see the module)."""

    def __init__(self, before: Latency) -> None:
        self.loop_budget_s = max(LEAST_BUDGET_S, before.loop_s * BUDGET)
        self.commit_budget_s = max(LEAST_BUDGET_S, before.commit_s * BUDGET)
        self.share = 1.0
        self.rested_s = 0.0  # in all
        self.steps = self.loop_over = self.commits_over = 0  # steps, and over budget by each

    def rest(self, worked_s: float, now: Latency, queued_bytes: int) -> float:
        """Seconds to rest after a step that took `worked_s`, the latency being `now` and
        `queued_bytes` of writes waiting behind the snapshot."""
        if queued_bytes > HURRY_BYTES:
            self.share = 1.0
            return 0.0
        self.steps += 1
        self.loop_over += now.loop_s > self.loop_budget_s
        self.commits_over += now.commit_s > self.commit_budget_s
        over = now.loop_s > self.loop_budget_s or now.commit_s > self.commit_budget_s
        self.share = max(FLOOR, self.share / 2) if over else min(1.0, self.share + RISE)
        rest = worked_s * (1 - self.share) / self.share
        self.rested_s += rest
        return rest
