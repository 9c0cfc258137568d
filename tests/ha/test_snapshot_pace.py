"""The pace of a snapshot (`cluster/snapshot_pace.py`): it gives way to the primary's clients
while their latency is over budget, but never below its floor, so a catch-up takes at most
1 / FLOOR times its unpaced time; it goes back to full speed once latency is within budget,
and stops resting when the writes queued behind the snapshot grow toward the drop limit."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.replication import MAX_QUEUED_BYTES
from cluster.snapshot_pace import FLOOR, HURRY_BYTES, LEAST_BUDGET_S, Latency, Pace

CALM = Latency(loop_s=0.0005, commit_s=0.001)
BUSY_LOOP = Latency(loop_s=0.05, commit_s=0.001)
SLOW_COMMITS = Latency(loop_s=0.0005, commit_s=0.05)


@pytest.mark.parametrize("busy", [BUSY_LOOP, SLOW_COMMITS])
def test_a_busy_primary_slows_the_snapshot_down_to_its_floor_and_no_further(
    busy: Latency,
) -> None:
    pace = Pace(CALM)
    rests = [pace.rest(0.01, busy, 0) for _ in range(10)]
    assert rests[0] == pytest.approx(0.01)  # half the time
    assert rests == sorted(rests)  # it gives way more each step the primary is busy
    assert pace.share == FLOOR
    assert rests[-1] == pytest.approx(0.01 * (1 - FLOOR) / FLOOR)  # a quarter of the time


def test_within_budget_it_streams_without_rest_and_recovers_after_a_busy_spell() -> None:
    pace = Pace(CALM)
    assert [pace.rest(0.01, CALM, 0) for _ in range(3)] == [0.0] * 3
    for _ in range(5):
        pace.rest(0.01, BUSY_LOOP, 0)
    assert pace.share == FLOOR
    rests = [pace.rest(0.01, CALM, 0) for _ in range(10)]
    assert rests == sorted(rests, reverse=True)  # less rest each calm step
    assert rests[-1] == 0.0 and pace.share == 1.0


def test_the_budget_is_the_latency_before_the_snapshot_with_room_and_a_least_value() -> None:
    idle = Pace(Latency(0.0, 0.0))  # an idle primary: no commits, an idle loop
    assert (idle.loop_budget_s, idle.commit_budget_s) == (LEAST_BUDGET_S, LEAST_BUDGET_S)
    assert idle.rest(0.01, Latency(LEAST_BUDGET_S / 2, LEAST_BUDGET_S / 2), 0) == 0.0
    loaded = Pace(Latency(0.01, 0.02))
    assert loaded.rest(0.01, Latency(0.014, 0.029), 0) == 0.0  # within 1.5x of before
    assert loaded.rest(0.01, Latency(0.016, 0.02), 0) > 0.0


def test_with_writes_piling_up_behind_the_snapshot_it_stops_resting() -> None:
    assert HURRY_BYTES < MAX_QUEUED_BYTES  # it hurries well before the backup is dropped
    pace = Pace(CALM)
    for _ in range(5):
        pace.rest(0.01, BUSY_LOOP, 0)
    assert pace.rest(0.01, BUSY_LOOP, HURRY_BYTES + 1) == 0.0
    assert pace.share == 1.0


@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 1.0), st.sampled_from([CALM, BUSY_LOOP, SLOW_COMMITS]), st.booleans()
        ),
        min_size=1,
        max_size=200,
    )
)
def test_a_catch_up_never_takes_more_than_one_over_floor_times_its_work(
    steps: list[tuple[float, Latency, bool]],
) -> None:
    pace = Pace(CALM)
    work = sum(worked for worked, _, _ in steps)
    total = work + sum(
        pace.rest(worked, now, HURRY_BYTES + 1 if hurry else 0) for worked, now, hurry in steps
    )
    assert total <= work / FLOOR + 1e-9
    assert pace.rested_s == pytest.approx(total - work)
