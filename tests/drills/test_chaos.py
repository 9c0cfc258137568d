"""The seeded chaos run (tests/chaos_run.py), three minutes of a fixed seed: the compose cluster
with every node paired under audited grouped load while the nemesis kills, pauses and cuts off
containers, one or two at once, and stops the whole stack. `chaos` fails the test, printing the
seed and its schedule, unless every fault is undone, every pair is back in sync, every
confirmed message is acked, no serving process holds a message any more, no container logged
an asyncio error, and `pinmq check` finds nothing lost, duplicated, reordered or delivered to
two consumers at once. `make chaos` runs longer and other seeds."""

from __future__ import annotations

from pathlib import Path

import pytest
from chaos_run import chaos, table
from compose_nodes import IMAGE, build_image

pytestmark = [pytest.mark.slow, pytest.mark.containers]

SEED = 2026
SECONDS = 180.0


async def test_three_minutes_of_seed_2026_end_with_a_clean_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, stats = await chaos(tmp_path, build_image(IMAGE), monkeypatch, SEED, SECONDS)
    assert len(run.applied) == len(run.faults) > 0
    assert all(a.end_ns >= a.start_ns > 0 for a in run.applied), "a fault was never undone"
    print(table(run.availability(stats)))  # the availability figures, in the test's output
