"""The pure queue core's group rules: shared mode, closing a group, group-first-key,
rebalance, reset, group keys (buckets, default group, headers) and the dispatch hold.

Driven like test_queue.py (`queue_harness.Harness`); every test states the behaviour it pins.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from queue_harness import MS, Harness, consumers_of, to

from broker.effects import Delivery, Effects
from broker.message import ALT_GROUP_ID_HEADER, GROUP_ID_HEADER
from broker.queue import QueueError

# ---- shared mode ----------------------------------------------------------------------------


def _three_groups_then_ack(h: Harness) -> None:
    """A -> c1, B -> c2, C -> c1; then B and A are acknowledged."""
    h.sub("c1")
    h.sub("c2")
    h.send("A")
    h.send("B")
    h.send("C")
    assert (h.owner("A"), h.owner("B"), h.owner("C")) == ("c1", "c2", "c1")
    h.ack("c2")
    h.ack("c1", h.ids("c1")[:1])


def test_shared_group_moves_once_nothing_is_outstanding() -> None:
    h = Harness(group_mode="shared")
    _three_groups_then_ack(h)
    assert h.owner("A") is None  # unpinned: nothing outstanding
    _, fx = h.send("A")
    assert consumers_of(fx) == {"c2"}  # c2 now has fewer groups


def test_sticky_group_does_not_move_in_the_same_situation() -> None:
    h = Harness(group_mode="sticky")
    _three_groups_then_ack(h)
    _, fx = h.send("A")
    assert consumers_of(fx) == {"c1"}


def test_shared_group_never_moves_while_outstanding() -> None:
    h = Harness(group_mode="shared")
    h.sub("c1", prefetch=1)
    h.sub("c2", prefetch=10)
    h.send("A")  # c1, now full
    a2, fx = h.send("A")
    assert fx.deliveries == []  # c2 has credit but A is outstanding at c1
    for g in ("B", "C"):
        h.send(g)
    assert a2.msg_id not in h.held_by("c2")
    fx = h.ack("c1")
    assert [d.message.msg_id for d in fx.deliveries] == [a2.msg_id]  # exactly one consumer
    holders = [c for c in ("c1", "c2") if a2.msg_id in h.held_by(c)]
    assert len(holders) == 1


def test_shared_partial_release_keeps_owner_while_something_is_outstanding() -> None:
    h = Harness(group_mode="shared")
    h.sub("c1", prefetch=2)
    h.sub("c2", prefetch=10)
    h.send("A")
    h.send("A")
    fx = h.release("c1", h.ids("c1")[1:])  # A2 back, A1 still at c1
    assert to(fx, "c2") == []
    assert to(fx, "c1") == [2]


# ---- closing a group with a negative sequence -------------------------------------------------


def test_negative_group_seq_closes_the_group_after_it_is_acked() -> None:
    h = Harness()
    h.sub("c1", prefetch=10)
    h.send("A", seq=1)
    h.send("A", seq=-1)  # closes A
    h.sub("c2", prefetch=10)
    h.send("B")  # -> c2 (fewer groups)
    a3, fx = h.send("A", seq=1)  # after the closing message: must wait for it to settle
    assert fx.deliveries == []
    h.ack("c1", h.ids("c1")[:1])  # A1 acked; the closing A2 is still outstanding
    assert a3.msg_id not in h.held_by("c1") + h.held_by("c2")
    fx = h.ack("c1", h.ids("c1")[:1])  # closing message acked: A is unpinned
    assert len(fx.deliveries) == 1 and fx.deliveries[0].message is a3
    assert fx.deliveries[0].first_in_group
    # Unpinned: A was assigned afresh to the least loaded consumer (c1: none, c2: B).
    assert h.owner("A") == "c1"


def test_closed_group_may_go_to_a_different_consumer_but_never_while_outstanding() -> None:
    h = Harness()
    h.sub("c1", prefetch=10)
    h.send("A", seq=1)
    h.send("C")
    h.sub("c2", prefetch=10)  # c1 owns A and C, c2 nothing
    h.send("A", seq=-3)  # closes A at c1
    a4, fx = h.send("A", seq=1)
    assert fx.deliveries == []  # c2 is idle but A's closing message is out
    h.ack("c1", h.ids("c1")[:1])  # A1 acked, closing message still out
    assert a4.msg_id not in h.held_by("c1") + h.held_by("c2")
    assert h.owner("A") == "c1"
    fx = h.ack("c1", h.ids("c1")[1:])  # the closing A#3: A is unpinned and moves
    assert [(d.consumer_id, d.message.msg_id, d.first_in_group) for d in fx.deliveries] == [
        ("c2", a4.msg_id, True)
    ]
    assert h.owner("A") == "c2"


# ---- group-first-key ------------------------------------------------------------------------


def test_first_in_group_marks_the_first_delivery_per_owner() -> None:
    h = Harness(group_first_key="JMSXGroupFirstForConsumer")
    h.sub("c1", prefetch=10)
    _, fx = h.send("A")
    assert [d.first_in_group for d in fx.deliveries] == [True]
    _, fx = h.send("A")
    assert [d.first_in_group for d in fx.deliveries] == [False]
    _, fx = h.send("B")
    assert [d.first_in_group for d in fx.deliveries] == [True]
    h.ack("c1")
    _, fx = h.send("A")  # idle but still pinned: not first
    assert [d.first_in_group for d in fx.deliveries] == [False]
    h.sub("c2", prefetch=10)
    h.close("c1")  # A's unacked message moves to c2: first again
    assert [(d.consumer_id, d.first_in_group) for d in h.log[-1:]] == [("c2", True)]
    _, fx = h.send("A")
    assert [(d.consumer_id, d.first_in_group) for d in fx.deliveries] == [("c2", False)]


# ---- group rebalance ------------------------------------------------------------------------


def _pin_idle_groups(h: Harness, n: int) -> list[str]:
    h.sub("c1", prefetch=100)
    names = [f"g{i}" for i in range(n)]
    for g in names:
        h.send(g)
    h.ack("c1")
    assert all(h.owner(g) == "c1" for g in names)
    return names


def test_rebalance_on_join_spreads_idle_groups_over_the_new_consumer() -> None:
    h = Harness(group_rebalance=True)
    names = _pin_idle_groups(h, 6)
    h.sub("c2", prefetch=100)
    for g in names:
        h.send(g)
    owners = [h.owner(g) for g in names]
    assert owners.count("c1") == 3 and owners.count("c2") == 3


def test_without_rebalance_idle_groups_stay_with_their_owner() -> None:
    h = Harness(group_rebalance=False)
    names = _pin_idle_groups(h, 6)
    h.sub("c2", prefetch=100)
    for g in names:
        _, fx = h.send(g)
        assert consumers_of(fx) == {"c1"}


def test_rebalance_never_gives_a_group_with_outstanding_messages_to_a_second_consumer() -> None:
    h = Harness(group_rebalance=True)
    h.sub("c1", prefetch=100)
    h.send("A")  # outstanding at c1
    h.send("B")
    h.ack("c1", h.ids("c1")[1:])  # B idle
    h.sub("c2", prefetch=100)
    a2, fx = h.send("A")
    assert a2.msg_id not in to(fx, "c2")
    assert a2.msg_id not in h.held_by("c2")
    for _ in range(3):
        h.send("C")
        assert a2.msg_id not in h.held_by("c2")
    fx = h.ack("c1", h.ids("c1")[:1])  # A1 settled: A may move now
    holders = [c for c in ("c1", "c2") if a2.msg_id in h.held_by(c)]
    assert len(holders) == 1


def test_rebalance_pause_dispatch_holds_everything_until_inflight_settle() -> None:
    h = Harness(group_rebalance=True, group_rebalance_pause_dispatch=True)
    h.sub("c1", prefetch=10)
    h.send("A")
    h.send("B")
    fx = h.sub("c2", prefetch=10)
    assert fx.deliveries == []
    sends = [h.send(g)[1] for g in ("C", None, "A", "D", None)]
    assert all(fx.deliveries == [] for fx in sends)
    fx = h.ack("c1", h.ids("c1")[:1])
    assert fx.deliveries == []  # B still in flight
    fx = h.ack("c1")
    delivered = sorted(d.message.msg_id for d in fx.deliveries)
    assert delivered == [3, 4, 5, 6, 7]
    assert consumers_of(fx) == {"c1", "c2"}
    # Nothing is paused any more.
    _, fx = h.send("E")
    assert len(fx.deliveries) == 1


def test_rebalance_pause_dispatch_without_inflight_does_not_pause() -> None:
    h = Harness(group_rebalance=True, group_rebalance_pause_dispatch=True)
    _pin_idle_groups(h, 2)
    h.sub("c2", prefetch=10)
    _, fx = h.send("g0")
    assert len(fx.deliveries) == 1


# ---- reset groups ----------------------------------------------------------------------------


def test_reset_all_groups_lets_them_move() -> None:
    h = Harness()
    names = _pin_idle_groups(h, 4)
    h.sub("c2", prefetch=100)
    h.reset(None)
    assert all(h.owner(g) is None for g in names)
    for g in names:
        h.send(g)
    owners = [h.owner(g) for g in names]
    assert owners.count("c1") == 2 and owners.count("c2") == 2


def test_reset_one_group_only_moves_that_group() -> None:
    h = Harness()
    h.sub("c1", prefetch=100)
    h.send("A")
    h.send("B")
    h.ack("c1")
    h.sub("c2", prefetch=100)
    h.reset("A")
    assert h.owner("B") == "c1"
    _, fx = h.send("A")
    assert consumers_of(fx) == {"c2"}
    _, fx = h.send("B")
    assert consumers_of(fx) == {"c1"}
    with pytest.raises(QueueError):
        h.reset("nope")


def test_reset_of_group_with_outstanding_messages_moves_it_only_after_settle() -> None:
    h = Harness()
    h.sub("c1", prefetch=100)
    h.send("A")
    h.sub("c2", prefetch=100)
    h.reset("A")
    a2, fx = h.send("A")
    assert a2.msg_id not in to(fx, "c2")
    fx = h.ack("c1")
    holders = [c for c in ("c1", "c2") if a2.msg_id in h.held_by(c)]
    assert len(holders) == 1


def test_a_group_s_oldest_pending_message_is_its_oldest_one_waiting() -> None:
    h = Harness()
    for h.now in (10 * MS, 20 * MS):
        h.send("g")
    assert [g.oldest_pending_ns for g in h.q.groups()] == [10 * MS]
    h.sub("c1", prefetch=1)
    assert [g.oldest_pending_ns for g in h.q.groups()] == [20 * MS]  # the first went out
    h.close("c1")  # it comes back, first
    assert [(g.pending, g.oldest_pending_ns) for g in h.q.groups()] == [(2, 10 * MS)]
    h.sub("c2", prefetch=2)
    assert [(g.pending, g.oldest_pending_ns) for g in h.q.groups()] == [(0, 0)]


# ---- group keys: buckets, default group, headers ------------------------------------------------


def test_group_buckets_zero_turns_grouping_off_round_robin() -> None:
    h = Harness(group_buckets=0)
    h.sub("c1")
    h.sub("c2")
    msgs = [h.send("A")[0] for _ in range(6)]
    assert all(m.group is None for m in msgs)
    assert h.held_by("c1") == [1, 3, 5]
    assert h.held_by("c2") == [2, 4, 6]
    assert h.q.groups() == []


def test_group_buckets_n_hash_groups_into_at_most_n_keys() -> None:
    h = Harness(group_buckets=4)
    h.sub("c1", prefetch=1000)
    h.sub("c2", prefetch=1000)
    msgs = [h.send(f"g{i % 50}")[0] for i in range(200)]
    keys = {m.group for m in msgs}
    assert keys <= {f"bucket-{n}" for n in range(4)}
    assert 1 < len(keys) <= 4
    assert len(h.q.groups()) == len(keys)
    by_gid: dict[str, set[str | None]] = defaultdict(set)
    for m in msgs:
        by_gid[m.headers[GROUP_ID_HEADER]].add(m.group)
    assert all(len(v) == 1 for v in by_gid.values())  # a group id maps to one bucket
    # A bucket behaves like one group: one consumer, in order.
    per_key: dict[str, list[Delivery]] = defaultdict(list)
    for d in h.log:
        per_key[d.message.group].append(d)  # type: ignore[index]
    for ds in per_key.values():
        assert len({d.consumer_id for d in ds}) == 1
        ids = [d.message.msg_id for d in ds]
        assert ids == sorted(ids)


def test_group_buckets_unbounded_keeps_group_ids() -> None:
    h = Harness(group_buckets=-1)
    h.sub("c1", prefetch=1000)
    msgs = [h.send(f"g{i}")[0] for i in range(50)]
    assert [m.group for m in msgs] == [f"g{i}" for i in range(50)]
    assert len(h.q.groups()) == 50


def test_default_group_collects_messages_without_group_id() -> None:
    h = Harness(default_group="qpid.no-group")
    h.sub("c1")
    h.sub("c2")
    msgs = [h.send(None)[0] for _ in range(4)]
    assert all(m.group == "qpid.no-group" for m in msgs)
    assert len({d.consumer_id for d in h.log}) == 1


def test_without_default_group_messages_without_group_id_are_ungrouped() -> None:
    h = Harness()
    h.sub("c1")
    h.sub("c2")
    msgs = [h.send(None)[0] for _ in range(4)]
    assert all(m.group is None for m in msgs)
    assert consumers_of(Effects(deliveries=h.log)) == {"c1", "c2"}


def test_amq_group_id_header_is_accepted() -> None:
    h = Harness()
    h.sub("c1")
    m, _ = h.send(None, **{ALT_GROUP_ID_HEADER: "A"})
    assert m.group == "A"
    m2, _ = h.send("A")
    assert m2.group == "A"  # the two headers name the same group
    assert len(h.q.groups()) == 1


def test_custom_group_header() -> None:
    h = Harness(group_header="tenant")
    h.sub("c1")
    m, _ = h.send(None, tenant="t1")
    assert m.group == "t1"
    m2, _ = h.send("X")  # JMSXGroupID is not the group header here
    assert m2.group is None


# ---- consumers-before-dispatch / delay-before-dispatch -------------------------------------------


def test_consumers_before_dispatch_waits_for_enough_consumers() -> None:
    h = Harness(consumers_before_dispatch=2)
    h.sub("c1")
    for g in ("A", "B", None):
        _, fx = h.send(g)
        assert fx.deliveries == []
    h.now = 10**12
    assert h.tick().deliveries == []  # no delay configured: wait forever
    fx = h.sub("c2")
    assert sorted(d.message.msg_id for d in fx.deliveries) == [1, 2, 3]
    assert consumers_of(fx) == {"c1", "c2"}


def test_delay_before_dispatch_starts_after_the_delay_with_fewer_consumers() -> None:
    h = Harness(consumers_before_dispatch=3, delay_before_dispatch=100)
    h.now = 5 * MS
    h.sub("c1")
    h.now = 6 * MS
    h.send("A")
    h.send(None)
    h.now = 104 * MS
    assert h.tick().deliveries == []
    h.now = 105 * MS
    fx = h.tick()
    assert to(fx, "c1") == [1, 2]
    _, fx = h.send("B")  # dispatch has started for good
    assert to(fx, "c1") == [3]


# ---- held groups (a clustered node that has not confirmed a group's binding) ---------------


def test_held_group_delivers_nothing_while_other_groups_flow() -> None:
    h = Harness()
    h.sub("c1")
    h.q.hold("A")
    a1, fx = h.send("A")
    assert to(fx, "c1") == []
    b1, fx = h.send("B")
    assert to(fx, "c1") == [b1.msg_id]
    fx = h._run(h.q.unhold, "A")
    assert to(fx, "c1") == [a1.msg_id]


def test_take_group_removes_the_waiting_messages_in_order_and_forgets_the_group() -> None:
    h = Harness()
    h.q.hold("A")
    sent = [h.send("A")[0] for _ in range(3)]
    h.send("B")
    fx = Effects()
    taken = h.q.take_group("A", fx)
    assert [m.msg_id for m in taken] == [m.msg_id for m in sent]
    assert fx.removed == taken
    assert not h.q.has_group("A") and h.q.depth == 1
    h.sub("c1")
    assert h.held_by("c1") == [sent[-1].msg_id + 1]  # only B is left


def test_take_group_refuses_a_group_that_is_not_held() -> None:
    h = Harness()
    h.send("A")
    with pytest.raises(QueueError, match="not on hold"):
        h.q.take_group("A", Effects())


def test_holding_a_group_leaves_its_delivered_messages_and_holds_what_comes_back() -> None:
    h = Harness()
    h.sub("c1", prefetch=1)
    a1, _ = h.send("A")
    a2, _ = h.send("A")
    assert h.held_by("c1") == [a1.msg_id]
    h.q.hold("A")
    fx = Effects()
    assert [m.msg_id for m in h.q.take_group("A", fx)] == [a2.msg_id]
    assert h.q.has_group("A")  # a1 is still at c1
    fx = h.release("c1", h.ids("c1"))
    assert to(fx, "c1") == []  # back, held: not delivered again here
    assert h.q.held_waiting("A")
    assert [m.msg_id for m in h.q.take_group("A", Effects())] == [a1.msg_id]
    assert not h.q.has_group("A")


# ---- stalled consumers (slow-consumer-threshold) -------------------------------------------


def test_a_consumer_that_settles_nothing_past_the_threshold_gets_no_new_group() -> None:
    h = Harness(slow_consumer_threshold=1_000)
    h.sub("c1")
    h.sub("c2")
    h.send("A")  # to c1 (fewest groups, first)
    h.send("B")  # to c2
    h.ack("c2")
    h.send("C")  # c1 and c2 tie at one group: c1
    assert (h.owner("A"), h.owner("B"), h.owner("C")) == ("c1", "c2", "c1")
    h.now += 1_001 * MS  # c1 has held A and C for longer than the threshold
    _, fx = h.send("D")
    assert consumers_of(fx) == {"c2"}  # although c2 would not be the least loaded otherwise
    assert fx.stalled == [("q", "c1", 2, 1_001 * MS)]
    _, fx = h.send("E")
    assert consumers_of(fx) == {"c2"} and fx.stalled == []  # said once
    stalled = {c.consumer_id: c.stalled_ms for c in h.q.consumers(h.now)}
    assert stalled == {"c1": 1_001, "c2": 0}
    _, fx = h.send("A")
    assert consumers_of(fx) == {"c1"}  # its own groups stay with it
    h.ack("c1", h.ids("c1")[:1])  # progress: it takes new groups again
    assert h.q.consumers(h.now)[0].stalled_ms == 0


def test_when_every_consumer_stalls_a_new_group_waits_for_one_that_does_not() -> None:
    h = Harness(slow_consumer_threshold=1_000)
    h.sub("c1")
    h.send("A")
    h.now += 2_000 * MS
    b, fx = h.send("B")
    assert to(fx, "c1") == []  # waits: ungrouped work would still go
    u, fx = h.send(None)
    assert to(fx, "c1") == [u.msg_id]
    fx = h.sub("c2")
    assert to(fx, "c2") == [b.msg_id]


def test_with_threshold_off_a_silent_consumer_keeps_taking_groups() -> None:
    h = Harness(slow_consumer_threshold=-1)
    h.sub("c1")
    h.send("A")
    h.now += 3_600_000 * MS
    b, fx = h.send("B")
    assert to(fx, "c1") == [b.msg_id] and fx.stalled == []
