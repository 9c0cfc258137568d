"""The pure queue core (`Queue`): ordering, stickiness, credit, no head-of-line blocking,
release, delivery attempts and dead letters, consumer close.

`Queue` is driven directly with explicit `now_ns` and one `Effects` per operation
(`queue_harness.Harness`). Every test states the behaviour it pins down.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from queue_harness import Harness, consumers_of, core_from, to

from broker.core import (
    ORIGINAL_ADDRESS_HEADER,
    ORIGINAL_QUEUE_HEADER,
)
from broker.effects import Delivery
from broker.message import GROUP_ID_HEADER, Outgoing
from broker.queue import QueueError

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


def test_broker_dead_letters_to_auto_created_dlq_with_original_headers() -> None:
    core = core_from('address-settings: {"#": {max-delivery-attempts: 2}}')
    msg_id, fx = core.send(Outgoing("orders", b"x", {GROUP_ID_HEADER: "A"}, True), 0)
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
    core = core_from(
        'address-settings: {"#": {max-delivery-attempts: 1, dead-letter-address: null}}'
    )
    msg_id, _ = core.send(Outgoing("orders", b"x", {}, False), 0)
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
    core = core_from()
    core.send(Outgoing("orders", b"x", {GROUP_ID_HEADER: "A"}, False), 0)
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
