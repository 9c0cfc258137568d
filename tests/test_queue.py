"""The pure queue core (`Queue`) and node core (`BrokerCore`): group semantics, routing, DLQ.

`Queue` is driven directly with explicit `now_ns` and one `Effects` per operation;
`BrokerCore` is built from a minimal YAML config. Every test states the behaviour it pins down.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.config import QueueConfig, parse_config
from broker.core import (
    ORIGINAL_ADDRESS_HEADER,
    ORIGINAL_QUEUE_HEADER,
    BrokerCore,
    UnknownAddress,
)
from broker.message import ALT_GROUP_ID_HEADER, GROUP_ID_HEADER, GROUP_SEQ_HEADER, Message
from broker.queue import Delivery, Effects, Queue, QueueError

MS = 1_000_000  # ns per ms


class Harness:
    """A `Queue` plus a message-id counter and a clock; every call returns its Effects."""

    def __init__(self, **settings: Any) -> None:
        self.q = Queue("q", "q", QueueConfig(**settings))
        self.next_id = 1
        self.now = 0
        self.log: list[Delivery] = []

    def _run(self, op: Any, *args: Any) -> Effects:
        fx = Effects()
        op(*args, self.now, fx)
        self.log += fx.deliveries
        return fx

    def send(
        self, group: str | None = None, seq: int | None = None, **headers: str
    ) -> tuple[Message, Effects]:
        if group is not None:
            headers[GROUP_ID_HEADER] = group
        if seq is not None:
            headers[GROUP_SEQ_HEADER] = str(seq)
        m = Message(self.next_id, "q", "q", f"{group}#{self.next_id}".encode(), headers)
        self.next_id += 1
        return m, self._run(self.q.enqueue, m)

    def sub(self, cid: str, prefetch: int = 100) -> Effects:
        return self._run(self.q.subscribe, cid, cid, prefetch)

    def close(self, cid: str) -> Effects:
        return self._run(self.q.close_consumer, cid)

    def ack(self, cid: str, ids: list[int] | None = None) -> Effects:
        return self._run(self.q.ack, cid, self.ids(cid) if ids is None else ids)

    def release(self, cid: str, ids: list[int]) -> Effects:
        return self._run(self.q.release, cid, ids)

    def reject(self, cid: str, ids: list[int]) -> Effects:
        return self._run(self.q.reject, cid, ids)

    def reset(self, group: str | None) -> Effects:
        return self._run(self.q.reset_groups, group)

    def tick(self) -> Effects:
        return self._run(self.q.tick)

    def ids(self, cid: str) -> list[int]:
        return [did for did, _ in self.q.unacked(cid)]

    def held_by(self, cid: str) -> list[int]:
        """Message ids the consumer holds unacknowledged, in delivery order."""
        return [m.msg_id for _, m in self.q.unacked(cid)]

    def owner(self, group: str) -> str | None:
        owners = {g.group: g.owner for g in self.q.groups()}
        return owners.get(group)


def to(fx: Effects, cid: str) -> list[int]:
    """Message ids delivered to `cid` in these effects, in order."""
    return [d.message.msg_id for d in fx.deliveries if d.consumer_id == cid]


def consumers_of(fx: Effects) -> set[str]:
    return {d.consumer_id for d in fx.deliveries}


# ---- ordering and stickiness ------------------------------------------------------------


def test_groups_stick_to_one_consumer_in_order_and_spread_evenly() -> None:
    h = Harness()
    for c in ("c1", "c2", "c3"):
        h.sub(c, prefetch=1000)
    sent: dict[str, list[int]] = defaultdict(list)
    for seq in range(1, 11):
        for g in range(30):
            m, _ = h.send(f"g{g}", seq=seq)
            sent[f"g{g}"].append(m.msg_id)
    per_group: dict[str, list[Delivery]] = defaultdict(list)
    for d in h.log:
        per_group[d.message.group].append(d)  # type: ignore[index]
    assert len(h.log) == 300
    assert set(per_group) == set(sent)
    for g, deliveries in per_group.items():
        assert {d.consumer_id for d in deliveries} == {deliveries[0].consumer_id}, g
        assert [d.message.msg_id for d in deliveries] == sent[g]
        assert [d.message.group_seq for d in deliveries] == list(range(1, 11))
    groups_per_consumer = {c: len(h.q.consumer_groups(c)) for c in ("c1", "c2", "c3")}
    assert groups_per_consumer == {"c1": 10, "c2": 10, "c3": 10}
    # The group table agrees with what was delivered.
    for g, deliveries in per_group.items():
        assert h.owner(g) == deliveries[0].consumer_id


def test_sticky_group_keeps_its_consumer_after_it_went_idle() -> None:
    h = Harness()
    h.sub("c1")
    h.sub("c2")
    _, fx = h.send("A")
    first = fx.deliveries[0].consumer_id
    other = "c2" if first == "c1" else "c1"
    h.ack(first)
    h.send("B")  # lands on the other consumer (fewer groups)
    h.ack(other)
    for _ in range(5):
        _, fx = h.send("A")
        assert consumers_of(fx) == {first}
        h.ack(first)
    assert h.owner("A") == first


def test_new_group_goes_to_least_loaded_consumer_with_credit() -> None:
    h = Harness()
    h.sub("c1", prefetch=1)
    h.sub("c2", prefetch=10)
    h.sub("c3", prefetch=10)
    h.send("A")  # c1 (all tie; subscription order), which is now out of credit
    for g in ("B", "C", "D", "E"):
        h.send(g)
    assert [h.owner(g) for g in "ABCDE"] == ["c1", "c2", "c3", "c2", "c3"]
    # c1 has the fewest groups (1 vs 2) but no credit: the new group must skip it.
    h.send("F")
    assert h.owner("F") in {"c2", "c3"}
    assert h.held_by("c1") == [1]
    h.ack("c1")  # credit back: c1 is the least loaded again
    h.send("G")
    assert h.owner("G") == "c1"


# ---- credit ------------------------------------------------------------------------------


def test_prefetch_caps_unacked_and_ack_frees_credit() -> None:
    h = Harness()
    h.sub("c1", prefetch=3)
    for i in range(10):
        h.send("AB"[i % 2])
    assert h.held_by("c1") == [1, 2, 3]
    fx = h.ack("c1", h.ids("c1")[:1])
    assert len(fx.deliveries) == 1  # one ack, one more message
    assert len(h.q.unacked("c1")) == 3
    fx = h.ack("c1")
    assert len(fx.deliveries) == 3
    while h.q.depth:
        assert len(h.q.unacked("c1")) <= 3
        fx = h.ack("c1")
        assert 0 < len(fx.deliveries) <= 3 or not h.q.depth
    delivered = [d.message.msg_id for d in h.log]
    assert sorted(delivered) == list(range(1, 11))
    assert [i for i in delivered if i % 2] == [1, 3, 5, 7, 9]  # group A in order
    assert [i for i in delivered if not i % 2] == [2, 4, 6, 8, 10]  # group B in order


def test_no_consumer_ever_exceeds_prefetch_with_many_groups() -> None:
    h = Harness()
    h.sub("c1", prefetch=2)
    h.sub("c2", prefetch=5)
    for i in range(40):
        h.send(f"g{i % 7}")
        assert len(h.q.unacked("c1")) <= 2
        assert len(h.q.unacked("c2")) <= 5
    assert len(h.q.unacked("c1")) == 2
    assert len(h.q.unacked("c2")) == 5


# ---- no head-of-line blocking ------------------------------------------------------------


def test_busy_owned_group_does_not_starve_new_groups_and_ungrouped() -> None:
    """One consumer: messages sent after U and B must not all overtake them."""
    h = Harness()
    h.sub("c1", prefetch=1)
    for _ in range(5):
        h.send("A")  # 1..5: A is pinned to c1 with a backlog
    u, _ = h.send(None)  # 6
    b, _ = h.send("B")  # 7
    later = [h.send("A")[0].msg_id for _ in range(3)]  # 8..10
    order = [d.message.msg_id for d in h.log]
    while h.q.depth:
        order += to(h.ack("c1"), "c1")
    assert sorted(order) == list(range(1, 11))
    assert order.index(u.msg_id) < order.index(later[0]), order
    assert order.index(b.msg_id) < order.index(later[0]), order


def test_blocked_group_does_not_block_other_groups_or_ungrouped() -> None:
    h = Harness()
    h.sub("c1", prefetch=1)
    h.sub("c2", prefetch=100)
    h.send("A")  # A -> c1, which is now out of credit
    assert h.owner("A") == "c1"
    a2, fx = h.send("A")
    assert fx.deliveries == []  # A waits for its owner
    b1, fx = h.send("B")
    assert to(fx, "c2") == [b1.msg_id]
    u1, fx = h.send(None)
    assert to(fx, "c2") == [u1.msg_id]
    b2, fx = h.send("B")
    assert to(fx, "c2") == [b2.msg_id]
    assert a2.msg_id not in h.held_by("c2")
    fx = h.ack("c1")
    assert to(fx, "c1") == [a2.msg_id]
    assert to(fx, "c2") == []


# ---- release -----------------------------------------------------------------------------


def test_release_goes_back_to_head_with_count_and_is_redelivered_first() -> None:
    h = Harness()
    h.sub("c1", prefetch=1)
    a1, _ = h.send("A")
    h.send("A")
    h.send("A")
    (did,) = h.ids("c1")
    fx = h.release("c1", [did])
    assert fx.updated == [a1]
    assert a1.delivery_count == 1
    assert to(fx, "c1") == [a1.msg_id]  # redelivered before A2
    assert fx.deliveries[0].message.delivery_count == 1
    assert fx.deliveries[0].delivery_id != did
    order = [a1.msg_id]
    while h.q.depth:
        order += to(h.ack("c1"), "c1")
    assert order == [1, 2, 3]


def test_release_of_earlier_message_returns_later_ones_of_its_group_in_order() -> None:
    h = Harness()
    h.sub("c1", prefetch=10)
    for g in ("A", "B", "A", "A", "B"):
        h.send(g)
    ids = dict(zip(h.held_by("c1"), h.ids("c1"), strict=True))  # msg id -> delivery id
    fx = h.release("c1", [ids[3]])  # A#3: A#4 comes back with it, A#1 and B stay
    assert [m.msg_id for m in fx.updated] == [3, 4]
    assert all(m.delivery_count == 1 for m in fx.updated)
    assert to(fx, "c1") == [3, 4]  # redelivered in order
    assert h.held_by("c1") == [1, 2, 5, 3, 4]
    # Stale ids (returned already, or returned together with an earlier one) are ignored.
    fx = h.release("c1", [ids[4]])
    assert fx.updated == [] and fx.deliveries == []
    fx = h.ack("c1", [ids[3]])
    assert fx.removed == []
    assert h.held_by("c1") == [1, 2, 5, 3, 4]


def test_release_of_two_ids_of_one_group_counts_each_message_once() -> None:
    h = Harness()
    h.sub("c1", prefetch=10)
    a1, _ = h.send("A")
    a2, _ = h.send("A")
    fx = h.release("c1", list(reversed(h.ids("c1"))))
    assert [m.msg_id for m in fx.updated] == [a1.msg_id, a2.msg_id]
    assert (a1.delivery_count, a2.delivery_count) == (1, 1)
    assert to(fx, "c1") == [a1.msg_id, a2.msg_id]


def test_unknown_delivery_ids_raise() -> None:
    h = Harness()
    h.sub("c1")
    h.send("A")
    for op in (h.ack, h.release, h.reject):
        with pytest.raises(QueueError):
            op("c1", [99])
        with pytest.raises(QueueError):
            op("c1", [0])
    with pytest.raises(QueueError):
        h.ack("nobody", [1])
    for op in (h.ack, h.release, h.reject):  # all or nothing: the valid id is untouched too
        with pytest.raises(QueueError):
            op("c1", [*h.ids("c1"), 99])
    assert h.held_by("c1") == [1]
    assert h.q.unacked("c1")[0][1].delivery_count == 0


def test_release_ungrouped_goes_back_to_the_head() -> None:
    h = Harness()
    h.sub("c1", prefetch=1)
    u1, _ = h.send(None)
    h.send(None)
    fx = h.release("c1", h.ids("c1"))
    assert to(fx, "c1") == [u1.msg_id]
    assert u1.delivery_count == 1


# ---- max delivery attempts, reject, dead letters -------------------------------------------


def test_max_delivery_attempts_kills_the_message_after_n_releases() -> None:
    h = Harness(max_delivery_attempts=3)
    h.sub("c1", prefetch=1)
    a1, _ = h.send("A")
    a2, _ = h.send("A")
    for attempt in (1, 2):
        fx = h.release("c1", h.ids("c1"))
        assert fx.dead == []
        assert to(fx, "c1") == [a1.msg_id]
        assert a1.delivery_count == attempt
    fx = h.release("c1", h.ids("c1"))
    assert fx.dead == [a1]
    assert a1.delivery_count == 3
    assert to(fx, "c1") == [a2.msg_id]  # the group goes on with the next message
    assert h.q.depth == 1
    assert h.owner("A") == "c1"


def _core(yaml_tail: str = "") -> BrokerCore:
    return BrokerCore(parse_config("node: {id: n1}\n" + yaml_tail, "t"))


def test_broker_dead_letters_to_auto_created_dlq_with_original_headers() -> None:
    core = _core('address-settings: {"#": {max-delivery-attempts: 2}}')
    msg_id, fx = core.send("orders", b"x", {GROUP_ID_HEADER: "A"}, True, 0)
    assert fx.queues_created[0][:2] == ("orders", "orders")
    fx = core.subscribe("orders", "c1", "c1", 1, 1)
    (d,) = fx.deliveries
    fx = core.release("orders", "c1", [d.delivery_id], 2)
    assert fx.dead == [] and len(fx.deliveries) == 1
    fx = core.release("orders", "c1", [fx.deliveries[0].delivery_id], 3)
    assert [m.msg_id for m in fx.dead] == [msg_id]
    assert [m.msg_id for m in fx.removed] == [msg_id]
    assert [(a, q) for a, q, _ in fx.queues_created] == [("DLQ", "DLQ")]
    (copy,) = fx.added
    assert copy.queue == "DLQ" and copy.address == "DLQ"
    assert copy.msg_id > msg_id
    assert copy.body == b"x"
    assert copy.headers[ORIGINAL_QUEUE_HEADER] == "orders"
    assert copy.headers[ORIGINAL_ADDRESS_HEADER] == "orders"
    assert copy.headers[GROUP_ID_HEADER] == "A"
    assert copy.persistent
    assert core.queue("orders").depth == 0
    assert core.queue("DLQ").depth == 1
    fx = core.subscribe("DLQ", "d1", "d1", 10, 4)
    assert [d.message.msg_id for d in fx.deliveries] == [copy.msg_id]


def test_broker_drops_dead_message_when_dead_letter_address_is_null() -> None:
    core = _core('address-settings: {"#": {max-delivery-attempts: 1, dead-letter-address: null}}')
    msg_id, _ = core.send("orders", b"x", {}, False, 0)
    (d,) = core.subscribe("orders", "c1", "c1", 1, 1).deliveries
    fx = core.release("orders", "c1", [d.delivery_id], 2)
    assert [m.msg_id for m in fx.dead] == [msg_id]
    assert [m.msg_id for m in fx.removed] == [msg_id]
    assert fx.added == [] and fx.queues_created == []
    assert [q.name for q in core.queues()] == ["orders"]
    assert core.queue("orders").depth == 0


def test_reject_dead_letters_and_the_group_keeps_its_owner() -> None:
    h = Harness()
    h.sub("c1")
    h.sub("c2")
    a1, _ = h.send("A")
    owner = h.owner("A")
    assert owner is not None
    other = "c2" if owner == "c1" else "c1"
    h.send("B")  # -> the other consumer
    h.send("C")  # -> the owner (tie): a freed A would now move to the other consumer
    fx = h.reject(owner, h.ids(owner)[:1])
    assert fx.dead == [a1]
    assert fx.updated == [] and fx.removed == []
    assert a1.delivery_count == 0
    assert h.owner("A") == owner
    for _ in range(3):
        _, fx = h.send("A")
        assert consumers_of(fx) == {owner}
    assert other not in {d.consumer_id for d in h.log if d.message.group == "A"}


def test_broker_reject_routes_to_dlq() -> None:
    core = _core()
    core.send("orders", b"x", {GROUP_ID_HEADER: "A"}, False, 0)
    (d,) = core.subscribe("orders", "c1", "c1", 5, 1).deliveries
    fx = core.reject("orders", "c1", [d.delivery_id], 2)
    assert [m.queue for m in fx.added] == ["DLQ"]
    assert fx.added[0].headers[ORIGINAL_QUEUE_HEADER] == "orders"
    assert not fx.added[0].persistent  # the original was not persistent
    assert core.queue("DLQ").depth == 1


# ---- consumer close ------------------------------------------------------------------------


def test_close_returns_unacked_in_order_and_moves_groups_to_another_consumer() -> None:
    h = Harness()
    h.sub("c1", prefetch=3)
    sent = [h.send(g)[0] for g in ("A", "A", "B", "A", "B")]  # c1 holds A1 A2 B3
    h.sub("c2", prefetch=10)  # no rebalance: c1 keeps A and B
    assert h.held_by("c1") == [1, 2, 3]
    assert h.held_by("c2") == []
    fx = h.close("c1")
    assert sorted(m.msg_id for m in fx.updated) == [1, 2, 3]
    assert [m.delivery_count for m in sent] == [1, 1, 1, 0, 0]
    got = to(fx, "c2")
    assert [i for i in got if i in (1, 2, 4)] == [1, 2, 4]
    assert [i for i in got if i in (3, 5)] == [3, 5]
    assert h.owner("A") == "c2" and h.owner("B") == "c2"
    assert h.q.consumer_count == 1
    with pytest.raises(QueueError):
        h.q.consumer_groups("c1")


def test_close_frees_groups_when_no_other_consumer_then_next_subscriber_gets_them() -> None:
    h = Harness()
    h.sub("c1")
    h.send("A")
    h.send("A")
    fx = h.close("c1")
    assert fx.deliveries == []
    assert h.q.depth == 2
    assert h.owner("A") is None
    fx = h.sub("c2")
    assert to(fx, "c2") == [1, 2]
    assert [d.message.delivery_count for d in fx.deliveries] == [1, 1]


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


# ---- BrokerCore routing -------------------------------------------------------------------------


def test_multicast_address_copies_to_every_queue() -> None:
    core = _core(
        "addresses:\n  news:\n    routing-type: multicast\n    queues: {s1: {}, s2: {}, s3: {}}\n"
    )
    msg_id, fx = core.send("news", b"hi", {GROUP_ID_HEADER: "A"}, True, 0)
    assert sorted(m.queue for m in fx.added) == ["s1", "s2", "s3"]
    assert {m.msg_id for m in fx.added} == {msg_id}
    assert len({id(m) for m in fx.added}) == 3  # separate copies
    assert all(core.queue(q).depth == 1 for q in ("s1", "s2", "s3"))


def test_anycast_two_queues_keeps_group_on_one_queue_and_round_robins_ungrouped() -> None:
    core = _core("addresses:\n  orders:\n    queues: {o1: {}, o2: {}}\n")
    where: dict[str | None, list[str]] = defaultdict(list)
    for i in range(20):
        gid = ["A", "B", None, "C", None][i % 5]
        headers = {GROUP_ID_HEADER: gid} if gid else {}
        _, fx = core.send("orders", b"", headers, False, i)
        assert len(fx.added) == 1
        where[gid].append(fx.added[0].queue)
    for gid in ("A", "B", "C"):
        assert len(set(where[gid])) == 1, gid
    assert {where[g][0] for g in ("A", "B", "C")} == {"o1", "o2"}
    assert set(where[None]) == {"o1", "o2"}
    assert core.queue("o1").depth + core.queue("o2").depth == 20


def test_auto_create_disabled_raises_unknown_address() -> None:
    core = _core('address-settings: {"#": {auto-create-queues: false}}')
    with pytest.raises(UnknownAddress):
        core.send("nowhere", b"", {}, False, 0)
    assert core.queues() == []


def test_auto_create_creates_queue_with_address_settings() -> None:
    core = _core('address-settings: {"orders.#": {default-group-buckets: 8}}')
    _, fx = core.send("orders.eu", b"", {}, False, 0)
    ((address, name, settings),) = fx.queues_created
    assert (address, name, settings.group_buckets) == ("orders.eu", "orders.eu", 8)
    assert core.queue("orders.eu").settings.group_buckets == 8


def test_delete_queue_returns_all_its_messages() -> None:
    core = _core()
    for i in range(5):
        core.send("orders", b"", {GROUP_ID_HEADER: f"g{i % 2}"}, False, i)
    core.send("orders", b"", {}, False, 5)
    fx = core.subscribe("orders", "c1", "c1", 2, 6)
    assert len(fx.deliveries) == 2
    fx = core.delete_queue("orders")
    assert sorted(m.msg_id for m in fx.removed) == [1, 2, 3, 4, 5, 6]
    assert core.queues() == []
    assert core.close_consumer("orders", "c1", 7).deliveries == []


def test_send_after_deleting_the_auto_created_queue_is_not_silently_lost() -> None:
    """An accepted anycast send must end up in a queue (auto-created again) or be refused."""
    core = _core()
    core.send("orders", b"", {}, True, 0)
    core.delete_queue("orders")
    try:
        _, fx = core.send("orders", b"again", {}, True, 1)
    except UnknownAddress:
        return
    assert [m.queue for m in fx.added] == ["orders"]
    assert core.queue("orders").depth == 1


def test_restore_messages_restores_order_and_continues_ids() -> None:
    core = _core("addresses:\n  orders:\n    queues: {orders: {}}\n")
    stored = [
        Message(msg_id=i, queue="orders", address="orders", body=b"", headers=h)
        for i, h in [
            (3, {GROUP_ID_HEADER: "A"}),
            (7, {}),
            (9, {GROUP_ID_HEADER: "A"}),
            (12, {GROUP_ID_HEADER: "B"}),
            (15, {GROUP_ID_HEADER: "A"}),
        ]
    ]
    stored[0].delivery_count = 2
    orphan = Message(msg_id=20, queue="gone", address="gone", body=b"")
    assert core.restore_messages([*stored, orphan], next_msg_id=1) == 1
    fx = core.subscribe("orders", "c1", "c1", 100, 0)
    got = [d.message.msg_id for d in fx.deliveries]
    assert sorted(got) == [3, 7, 9, 12, 15]
    assert [i for i in got if i in (3, 9, 15)] == [3, 9, 15]  # group A in stored order
    assert fx.deliveries[0].message.delivery_count == 2
    msg_id, _ = core.send("orders", b"", {}, False, 1)
    assert msg_id == 21  # after the highest stored id, orphans included


def test_restore_messages_respects_a_higher_next_id() -> None:
    core = _core()
    assert core.restore_messages([], next_msg_id=500) == 0
    msg_id, _ = core.send("orders", b"", {}, False, 0)
    assert msg_id == 500


def test_persistent_only_on_durable_queues() -> None:
    core = _core(
        "addresses:\n  d: {queues: {d: {durable: true}}}\n  t: {queues: {t: {durable: false}}}\n"
    )
    _, fx = core.send("d", b"", {}, True, 0)
    assert [m.persistent for m in fx.added] == [True]
    _, fx = core.send("d", b"", {}, False, 0)
    assert [m.persistent for m in fx.added] == [False]
    _, fx = core.send("t", b"", {}, True, 0)
    assert [m.persistent for m in fx.added] == [False]


# ---- property: invariants under random operations ------------------------------------------------

_OPS = st.one_of(
    st.tuples(st.just("send"), st.sampled_from(["A", "B", "C", "D", None]), st.booleans()),
    st.tuples(st.just("sub"), st.integers(0, 2), st.integers(1, 3)),
    st.tuples(st.just("close"), st.integers(0, 2)),
    st.tuples(st.sampled_from(["ack", "release", "reject"]), st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("reset"), st.sampled_from(["A", "B", None])),
)
_SETTINGS = st.fixed_dictionaries(
    {
        "group_mode": st.sampled_from(["sticky", "shared"]),
        "group_rebalance": st.booleans(),
        "group_rebalance_pause_dispatch": st.booleans(),
        "group_buckets": st.sampled_from([-1, 0, 2]),
        "max_delivery_attempts": st.integers(1, 4),
        "consumers_before_dispatch": st.integers(0, 2),
    }
)


class _Model:
    """What must hold: per-group FIFO, one holder per group, prefetch, stickiness, no loss.

    A group may change consumer only after something allowed it to: its owner closed, a
    reset, a rebalancing subscribe, a closing (negative sequence) message of it settled or
    came back, or (shared mode) nothing of it being outstanding.
    """

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.shared = h.q.settings.group_mode == "shared"
        self.live: dict[int, Message] = {}
        self.out: dict[int, str] = {}  # msg id -> consumer holding it
        self.prefetch: dict[str, int] = {}
        self.owner: dict[str, str] = {}  # group -> consumer it last went to
        self.may_move: set[str] = set()

    def freed(self, cid: str | None) -> None:
        """Groups of `cid` (all groups when None) may move from now on."""
        self.may_move |= {g for g, c in self.owner.items() if cid is None or c == cid}

    def apply(self, fx: Effects) -> None:
        gone = fx.removed + fx.dead
        for m in gone:
            self.live.pop(m.msg_id, None)
        for m in gone + fx.updated:
            self.out.pop(m.msg_id, None)
        for m in gone + fx.updated:
            if m.group is not None and (
                m.group_seq < 0
                or (self.shared and not any(self.live[i].group == m.group for i in self.out))
            ):
                self.may_move.add(m.group)
        for d in fx.deliveries:
            m = d.message
            assert m.msg_id in self.live and m.msg_id not in self.out
            if m.group is not None:
                same = [i for i, x in self.live.items() if x.group == m.group]
                waiting = [i for i in same if i not in self.out]
                assert m.msg_id == min(waiting), "group delivered out of order"
                holders = {self.out[i] for i in same if i in self.out}
                assert holders <= {d.consumer_id}, "group at two consumers"
                assert all(i < m.msg_id for i in same if i in self.out)
                before = self.owner.get(m.group)
                if before != d.consumer_id:
                    assert before is None or m.group in self.may_move, "sticky group moved"
                    assert d.first_in_group, "first delivery at a new owner not marked"
                elif m.group not in self.may_move:
                    assert not d.first_in_group, "first_in_group on a group it already had"
                self.owner[m.group] = d.consumer_id
                self.may_move.discard(m.group)
            else:
                assert not d.first_in_group
            self.out[m.msg_id] = d.consumer_id
        for c, p in self.prefetch.items():
            assert len(self.h.q.unacked(c)) <= p
        assert sorted(m.msg_id for m in self.h.q.held()) == sorted(self.live)
        assert self.h.q.depth == len(self.live)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=_SETTINGS, ops=st.lists(_OPS, max_size=60))
def test_random_operations_keep_the_invariants(cfg: dict[str, Any], ops: list[tuple]) -> None:
    h = Harness(**cfg)
    model = _Model(h)
    names = ["c0", "c1", "c2"]
    for step, op in enumerate(ops):
        h.now = step * MS
        kind = op[0]
        if kind == "send":
            m, fx = h.send(op[1], seq=-1 if op[2] else None)
            model.live[m.msg_id] = m
        elif kind == "sub":
            cid = names[op[1]]
            if cid in model.prefetch:
                continue
            model.prefetch[cid] = op[2]
            if h.q.settings.group_rebalance:
                model.freed(None)
            fx = h.sub(cid, prefetch=op[2])
        elif kind == "close":
            cid = names[op[1]]
            model.prefetch.pop(cid, None)
            model.freed(cid)
            fx = h.close(cid)
        elif kind == "reset":
            if op[1] is not None and op[1] not in {g.group for g in h.q.groups()}:
                continue
            if op[1] is None:
                model.freed(None)
            else:
                model.may_move.add(op[1])
            fx = h.reset(op[1])
        else:
            cid = names[op[1]]
            if cid not in model.prefetch or not h.ids(cid):
                continue
            ids = h.ids(cid)
            fx = getattr(h, kind)(cid, [ids[op[2] % len(ids)]])
        model.apply(fx)
    # Drain: with enough consumers acking everything, every message ends acked or dead.
    for cid in names:
        if cid not in model.prefetch:
            model.prefetch[cid] = 5
            if h.q.settings.group_rebalance:
                model.freed(None)
            model.apply(h.sub(cid, prefetch=5))
    for _ in range(200):
        if not h.q.depth:
            break
        for cid in names:
            if h.ids(cid):
                model.apply(h.ack(cid))
    assert h.q.depth == 0
    assert model.live == {}
