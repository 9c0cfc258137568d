"""The chaos run's schedule (tests/nemesis.py): a seed replays exactly, faults overlap without
ever hitting a container that another fault holds, and the whole-stack fault holds alone."""

from __future__ import annotations

import itertools

from nemesis import ONE, Fault, Mix, schedule, waits_for

SERVICES = ("node1", "node1-backup", "node2", "node2-backup", "node3", "node3-backup")


def test_a_seed_draws_the_same_schedule_every_time_and_another_seed_another() -> None:
    assert schedule(7, 600, SERVICES) == schedule(7, 600, SERVICES)
    assert schedule(7, 600, SERVICES) != schedule(8, 600, SERVICES)


def test_faults_overlap_but_never_on_one_container_and_the_stack_fault_holds_alone() -> None:
    for seed in range(40):
        faults = schedule(seed, 1800, SERVICES)
        for a, b in itertools.combinations(faults, 2):
            overlap = a.at_s < b.until_s and b.at_s < a.until_s
            if overlap:
                assert "stack" not in (a.kind, b.kind), (seed, a, b)
                assert not set(a.targets) & set(b.targets), (seed, a, b)


def test_a_long_run_draws_every_kind_alone_and_two_at_once_overlapping_and_ends_quiet() -> None:
    mix = Mix()
    faults = schedule(1, 1800, SERVICES, mix)
    kinds = {f.kind for f in faults}
    assert kinds == {*ONE, "stack"}
    assert {len(f.targets) for f in faults if f.kind != "stack"} == {1, 2}
    assert any(a.at_s < b.at_s < a.until_s for a, b in itertools.pairwise(faults))
    assert all(f.until_s <= 1800 - mix.quiet_end_s + 0.01 for f in faults)
    assert [f.at_s for f in faults] == sorted(f.at_s for f in faults)


def test_disk_fills_come_one_at_a_time_and_leave_the_container_faults_as_they_were() -> None:
    for seed in range(40):
        plain = schedule(seed, 1800, SERVICES)
        faults = schedule(seed, 1800, SERVICES, disks=SERVICES)
        fills = [f for f in faults if f.kind == "fill"]
        assert [f for f in faults if f.kind != "fill"] == plain  # a seed replays either way
        assert fills and {len(f.targets) for f in fills} == {1}
        assert all(a.until_s <= b.at_s for a, b in itertools.pairwise(fills)), seed
        assert [f.at_s for f in faults] == sorted(f.at_s for f in faults)
    assert {f.targets[0] for f in fills} == set(SERVICES)  # over a long run, every disk


def test_a_fault_waits_for_the_undoing_of_an_earlier_one_on_its_containers_or_the_stack() -> None:
    kill = Fault(1.0, "kill", ("node1", "node2"), 2.0)
    assert waits_for(kill, Fault(3.0, "pause", ("node2",), 1.0))
    assert not waits_for(kill, Fault(3.0, "pause", ("node3",), 1.0))
    stack = Fault(5.0, "stack", (), 2.0)
    assert waits_for(stack, Fault(7.0, "pause", ("node3",), 1.0))
    assert waits_for(kill, stack)
    fill = Fault(1.0, "fill", ("node1",), 9.0)
    assert not waits_for(fill, kill) and not waits_for(stack, fill)  # a disk is no container
    assert waits_for(fill, Fault(10.0, "fill", ("node1",), 1.0))
