"""The chaos run's faults: a schedule drawn from a seed, pure, so a seed replays exactly.

A fault hits one container or two at once (`kill`: SIGKILL, then started again; `pause`:
frozen, then thawed; `disconnect`: off the cluster network, then back), or the whole stack
(`stack`: every container stopped, then started). Faults overlap: a new one may start while
others hold, on containers they leave alone; a `stack` fault waits until nothing else holds,
and nothing starts while it does. Apart from those, a `fill` fault fills one service's disk
to its limit, then frees it (tests/disk_images.py), one disk at a time: a disk is not its
container, so a fill may overlap any container fault, its own container's too. Fills are drawn
from a stream of their own, so the container faults of a seed are the same with disks or
without. `schedule(seed, seconds, services, disks=...)` is the same list for the same
arguments, whatever runs it (bench/chaos.py).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

ONE = ("kill", "pause", "disconnect")


@dataclass(frozen=True)
class Fault:
    """`kind` on `targets` (no target: `stack`) `at_s` into the run, undone `hold_s` later."""

    at_s: float
    kind: str
    targets: tuple[str, ...]
    hold_s: float

    @property
    def until_s(self) -> float:
        return self.at_s + self.hold_s

    def describe(self) -> str:
        what = " + ".join(self.targets) if self.targets else "the whole stack"
        return f"{self.at_s:7.2f} s  {self.kind:<10} {what} for {self.hold_s:.2f} s"


@dataclass(frozen=True)
class Mix:
    """How faults are drawn: the mean pause between two starts, how long one holds, the share
    that hits two containers at once, the share that stops the whole stack, and a quiet end
    (no fault starts then: the run's last moments show every group served again)."""

    mean_gap_s: float = 6.0
    hold_s: tuple[float, float] = (1.0, 8.0)
    two_at_once: float = 0.25
    stack: float = 0.04
    quiet_end_s: float = 10.0
    fill_gap_s: float = 40.0  # the mean pause between two disk fills
    fill_hold_s: tuple[float, float] = (2.0, 10.0)


def waits_for(earlier: Fault, fault: Fault) -> bool:
    """Whether `fault` may start only once `earlier` is undone: the schedule keeps them apart,
    but undoing takes time (a whole stack's start, seconds) and a container must be back
    before its next fault. Disks and containers are apart: a fill never waits for a kill."""
    if (earlier.kind == "fill") != (fault.kind == "fill"):
        return False
    return "stack" in (earlier.kind, fault.kind) or bool(set(earlier.targets) & set(fault.targets))


def schedule(
    seed: int,
    seconds: float,
    services: Sequence[str],
    mix: Mix | None = None,
    disks: Sequence[str] = (),
) -> list[Fault]:
    """The faults of a run of `seconds` over `services` (and fills of `disks`), in start
    order."""
    mix = mix or Mix()
    faults = _containers(seed, seconds, services, mix) + _fills(seed, seconds, disks, mix)
    return sorted(faults, key=lambda f: f.at_s)


def _containers(seed: int, seconds: float, services: Sequence[str], mix: Mix) -> list[Fault]:
    rng = random.Random(seed)
    busy: dict[str, float] = {}  # container -> until when a fault holds it
    stack_until = 0.0
    faults: list[Fault] = []
    t = rng.uniform(2.0, mix.mean_gap_s)
    while t < seconds - mix.quiet_end_s:
        hold = round(rng.uniform(*mix.hold_s), 2)
        hold = min(hold, round(seconds - mix.quiet_end_s - t, 2))
        free = [s for s in services if busy.get(s, 0.0) <= t]
        roll = rng.random()
        if t >= stack_until:
            if roll < mix.stack and len(free) == len(services):
                faults.append(Fault(round(t, 2), "stack", (), hold))
                stack_until = t + hold
            elif free:
                n = 2 if roll > 1 - mix.two_at_once and len(free) >= 2 else 1
                targets = tuple(sorted(rng.sample(free, n)))
                faults.append(Fault(round(t, 2), rng.choice(ONE), targets, hold))
                for target in targets:
                    busy[target] = t + hold
        t += max(0.5, rng.expovariate(1 / mix.mean_gap_s))
    return faults


def _fills(seed: int, seconds: float, disks: Sequence[str], mix: Mix) -> list[Fault]:
    if not disks:
        return []
    rng = random.Random(f"fill-{seed}")
    faults: list[Fault] = []
    t = rng.uniform(mix.fill_gap_s / 4, mix.fill_gap_s)
    while t < seconds - mix.quiet_end_s:
        hold = round(min(rng.uniform(*mix.fill_hold_s), seconds - mix.quiet_end_s - t), 2)
        faults.append(Fault(round(t, 2), "fill", (rng.choice(list(disks)),), hold))
        t += hold + max(1.0, rng.expovariate(1 / mix.fill_gap_s))
    return faults
