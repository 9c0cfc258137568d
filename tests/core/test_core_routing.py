"""The node core (`BrokerCore`): routing to queues and addresses, and invariants of the queue
core under random operations (hypothesis).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from queue_harness import MS, Harness, core_from

from broker.core import (
    UnknownAddress,
)
from broker.effects import Effects
from broker.message import GROUP_ID_HEADER, Message, Outgoing

# ---- BrokerCore routing -------------------------------------------------------------------------


def test_multicast_address_copies_to_every_queue() -> None:
    core = core_from(
        "addresses:\n  news:\n    routing-type: multicast\n    queues: {s1: {}, s2: {}, s3: {}}\n"
    )
    msg_id, fx = core.send(Outgoing("news", b"hi", {GROUP_ID_HEADER: "A"}, True), 0)
    assert sorted(m.queue for m in fx.added) == ["s1", "s2", "s3"]
    assert {m.msg_id for m in fx.added} == {msg_id}
    assert len({id(m) for m in fx.added}) == 3  # separate copies
    assert all(core.queue(q).depth == 1 for q in ("s1", "s2", "s3"))


def test_anycast_two_queues_keeps_group_on_one_queue_and_round_robins_ungrouped() -> None:
    core = core_from("addresses:\n  orders:\n    queues: {o1: {}, o2: {}}\n")
    where: dict[str | None, list[str]] = defaultdict(list)
    for i in range(20):
        gid = ["A", "B", None, "C", None][i % 5]
        headers = {GROUP_ID_HEADER: gid} if gid else {}
        _, fx = core.send(Outgoing("orders", b"", headers, False), i)
        assert len(fx.added) == 1
        where[gid].append(fx.added[0].queue)
    for gid in ("A", "B", "C"):
        assert len(set(where[gid])) == 1, gid
    assert {where[g][0] for g in ("A", "B", "C")} == {"o1", "o2"}
    assert set(where[None]) == {"o1", "o2"}
    assert core.queue("o1").depth + core.queue("o2").depth == 20


def test_auto_create_disabled_raises_unknown_address() -> None:
    core = core_from('address-settings: {"#": {auto-create-queues: false}}')
    with pytest.raises(UnknownAddress):
        core.send(Outgoing("nowhere", b"", {}, False), 0)
    assert core.queues() == []


def test_auto_create_creates_queue_with_address_settings() -> None:
    core = core_from('address-settings: {"orders.#": {default-group-buckets: 8}}')
    _, fx = core.send(Outgoing("orders.eu", b"", {}, False), 0)
    ((address, name, settings),) = fx.queues_created
    assert (address, name, settings.group_buckets) == ("orders.eu", "orders.eu", 8)
    assert core.queue("orders.eu").settings.group_buckets == 8


def test_delete_queue_returns_all_its_messages() -> None:
    core = core_from()
    for i in range(5):
        core.send(Outgoing("orders", b"", {GROUP_ID_HEADER: f"g{i % 2}"}, False), i)
    core.send(Outgoing("orders", b"", {}, False), 5)
    fx = core.subscribe("orders", "c1", "c1", 2, 6)
    assert len(fx.deliveries) == 2
    fx = core.delete_queue("orders")
    assert sorted(m.msg_id for m in fx.removed) == [1, 2, 3, 4, 5, 6]
    assert core.queues() == []
    assert core.close_consumer("orders", "c1", 7).deliveries == []


def test_send_after_deleting_the_auto_created_queue_is_not_silently_lost() -> None:
    """An accepted anycast send must end up in a queue (auto-created again) or be refused."""
    core = core_from()
    core.send(Outgoing("orders", b"", {}, True), 0)
    core.delete_queue("orders")
    try:
        _, fx = core.send(Outgoing("orders", b"again", {}, True), 1)
    except UnknownAddress:
        return
    assert [m.queue for m in fx.added] == ["orders"]
    assert core.queue("orders").depth == 1


def test_restore_messages_restores_order_and_continues_ids() -> None:
    core = core_from("addresses:\n  orders:\n    queues: {orders: {}}\n")
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
    assert core.restore_messages([*stored, orphan], next_msg_id=1) == (len(stored), 1)
    fx = core.subscribe("orders", "c1", "c1", 100, 0)
    got = [d.message.msg_id for d in fx.deliveries]
    assert sorted(got) == [3, 7, 9, 12, 15]
    assert [i for i in got if i in (3, 9, 15)] == [3, 9, 15]  # group A in stored order
    assert fx.deliveries[0].message.delivery_count == 2
    msg_id, _ = core.send(Outgoing("orders", b"", {}, False), 1)
    assert msg_id == 21  # after the highest stored id, orphans included


def test_restore_messages_respects_a_higher_next_id() -> None:
    core = core_from()
    assert core.restore_messages([], next_msg_id=500) == (0, 0)
    msg_id, _ = core.send(Outgoing("orders", b"", {}, False), 0)
    assert msg_id == 500


def test_persistent_only_on_durable_queues() -> None:
    core = core_from(
        "addresses:\n  d: {queues: {d: {durable: true}}}\n  t: {queues: {t: {durable: false}}}\n"
    )
    _, fx = core.send(Outgoing("d", b"", {}, True), 0)
    assert [m.persistent for m in fx.added] == [True]
    _, fx = core.send(Outgoing("d", b"", {}, False), 0)
    assert [m.persistent for m in fx.added] == [False]
    _, fx = core.send(Outgoing("t", b"", {}, True), 0)
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
