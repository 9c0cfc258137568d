"""The snapshot's pace (cluster/catchup_pace.py): the wait between frames follows the
primary's own latencies against budgets set from them before the snapshot."""

from __future__ import annotations

from cluster.catchup_pace import FLOOR_MS, MAX_WAIT_MS, CatchupPace, Latency


def pace(loop_budget: float = 5.0, commit_budget: float = 20.0) -> CatchupPace:
    return CatchupPace(Latency(loop_budget), Latency(commit_budget))


def test_a_budget_is_a_multiple_of_the_mean_before_the_snapshot_above_a_floor() -> None:
    assert Latency.from_baseline(12.0, 3).budget_ms == 6.0  # 1.5 x the mean of 4 ms
    assert Latency.from_baseline(0.3, 2).budget_ms == FLOOR_MS
    assert Latency.from_baseline(0.0, 0).budget_ms == FLOOR_MS  # no sample: an idle primary


def test_a_primary_within_its_budgets_gets_the_snapshot_at_full_speed() -> None:
    p = pace()
    for late, commit in ((0.5, 10.0), (4.9, 19.9), (5.0, 20.0), (1.0, 0.0)):
        p.loop.observe(late)
        p.commits.observe(commit)
        assert p.next_wait_s() == 0.0
    assert p.next_wait_s() == 0.0  # nothing seen (no commit: no live load): no wait


def test_the_wait_doubles_while_over_budget_up_to_its_cap_and_halves_back_to_nothing() -> None:
    p = pace()
    waits = []
    for _ in range(12):
        p.loop.observe(20.0)
        waits.append(p.next_wait_s() * 1000)
    assert waits[:4] == [1.0, 2.0, 4.0, 8.0]
    assert max(waits) == MAX_WAIT_MS and waits[-1] == MAX_WAIT_MS  # the snapshot still moves
    calm = []
    while p.wait_ms:
        p.loop.observe(1.0)
        calm.append(p.next_wait_s() * 1000)
    assert calm[:2] == [MAX_WAIT_MS / 2, MAX_WAIT_MS / 4] and calm[-1] == 0.0
    assert len(calm) < 12  # back to full speed within a few frames


def test_slow_commits_alone_slow_the_snapshot() -> None:
    """A loop on time, but the store's syncs slower than before (the disk shared with the
    backup's inserts): the snapshot waits too."""
    p = pace()
    p.loop.observe(0.5)
    p.commits.observe(90.0, seen=3)  # three commits of 30 ms on average
    assert p.next_wait_s() > 0


def test_the_mean_since_the_last_frame_counts_not_one_spike() -> None:
    p = pace()
    for late in (1.0, 12.0, 1.0, 1.0):  # a spike a live load makes now and then
        p.loop.observe(late)
    assert p.next_wait_s() == 0.0
    for late in (1.0, 30.0, 1.0):  # late on average: the snapshot waits
        p.loop.observe(late)
    assert p.next_wait_s() > 0
    p.loop.observe(1.0)  # forgotten at the frame
    assert p.next_wait_s() == 0.0
