"""Hypothesis drives one queue with random steps and checks the group invariants after each.

The test keeps its own ledger of what was sent, delivered, acknowledged and dead-lettered and
compares the queue against it; it does not re-implement dispatch.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from broker.config import QueueConfig
from broker.dispatch import DEEP
from broker.effects import Effects
from broker.group_state import DETACHING, HELD, OWNED, OWNERSHIP, UNOWNED, state_name
from broker.message import Message
from broker.queue import Queue

CONSUMERS = ["c0", "c1", "c2", "c3"]
GROUPS = ["g0", "g1", "g2", "g3", "g4", None]
HOLDABLE = ["g0", "g1", "dflt", "bucket-0"]  # group keys, with buckets and the default group

queue_settings = st.builds(
    QueueConfig,
    group_mode=st.sampled_from(["sticky", "shared"]),
    group_buckets=st.sampled_from([-1, -1, 0, 2]),
    group_rebalance=st.booleans(),
    group_rebalance_pause_dispatch=st.booleans(),
    group_first_key=st.sampled_from([None, "first"]),
    default_group=st.sampled_from([None, "dflt"]),
    max_delivery_attempts=st.integers(min_value=2, max_value=4),
    consumers_before_dispatch=st.sampled_from([0, 0, 2]),
    delay_before_dispatch=st.sampled_from([-1, 50]),
    slow_consumer_threshold=st.sampled_from([-1, 0, 30, 10_000]),
)


class QueueMachine(RuleBasedStateMachine):
    @initialize(config=queue_settings)
    def setup(self, config: QueueConfig) -> None:
        self.q = Queue("q", "q", config)
        self.now = 0
        self.next_id = 1
        self.key_of: dict[int, str | None] = {}  # msg id -> group key the queue gave it
        self.order: dict[int, int] = {}  # msg id -> position within its group key
        self.per_key = defaultdict(int)
        self.held: dict[str, dict[int, int]] = {}  # consumer -> delivery id -> msg id
        self.prefetch: dict[str, int] = {}
        self.settled: set[int] = set()  # acked or dead
        self.sent = 0
        self.deliveries_seen = 0
        self.paging = False  # sends may be paged (the core's choice when the address is full)
        self.disk: dict[str | None, list[Message]] = defaultdict(list)  # paged, per group
        self.on_hold: set[str] = set()  # held, until unheld or forgotten

    # ---- steps --------------------------------------------------------------------------

    def _apply(self, fx: Effects) -> None:
        for m in (*fx.dead, *fx.removed):
            self.settled.add(m.msg_id)
        for d in fx.deliveries:
            m = d.message
            assert d.consumer_id in self.held, "delivered to a consumer that is not subscribed"
            self._check_in_order(d.consumer_id, m)
            assert m.group not in self.on_hold, f"held group {m.group} delivered"
            self.held[d.consumer_id][d.delivery_id] = m.msg_id
            self.deliveries_seen += 1

    def _check_in_order(self, consumer: str, m: Message) -> None:
        """Every earlier message of the group is settled or held by this same consumer."""
        key = self.key_of[m.msg_id]
        assert m.group == key
        if key is None:
            return
        mine = set(self.held[consumer].values())
        for other, pos in self.order.items():
            if self.key_of[other] == key and pos < self.order[m.msg_id]:
                assert other in self.settled or other in mine, (
                    f"{m.msg_id} of {key} delivered to {consumer} before {other}"
                )

    @rule(group=st.sampled_from(GROUPS), closing=st.booleans())
    def send(self, group: str | None, closing: bool) -> None:
        headers = {} if group is None else {"JMSXGroupID": group}
        if closing:
            headers["JMSXGroupSeq"] = "-1"
        msg_id = self.next_id
        self.next_id += 1
        key = self.q.group_key(headers)
        self.key_of[msg_id] = key
        self.order[msg_id] = self.per_key[key]
        self.per_key[key] += 1
        self.sent += 1
        fx = Effects()
        m = Message(msg_id, "q", "q", b"", headers, persistent=True, enqueued_ns=self.now + 1)
        paged_before = self.disk[key] != []
        if self.q.enqueue(m, self.now, fx, may_page=self.paging):
            self.disk[key].append(m)
        else:
            assert not paged_before, f"a message of {key} overtook its group's paged ones"
        self._apply(fx)

    @rule(on=st.booleans())
    def address_full(self, on: bool) -> None:
        self.paging = on

    @rule(data=st.data(), n=st.integers(min_value=1, max_value=4))
    def page_in(self, data: st.DataObject, n: int) -> None:
        """Room came back: a group the queue wants read back gets its oldest paged ones."""
        wanted = self.q.wanted(10, n)
        if wanted:
            self._read_back(*data.draw(st.sampled_from(wanted)))

    @rule(n=st.integers(min_value=1, max_value=3))
    def spill(self, n: int) -> None:
        """Memory is wanted elsewhere: groups whose owner has no credit page their newest."""
        for m in self.q.spill(writing=(), wanted_bytes=n * 200):
            assert self.key_of[m.msg_id] == m.group and m.msg_id not in self.settled
            page = self.disk[m.group]
            page.append(m)
            page.sort(key=lambda x: x.msg_id)

    def _read_back(self, group: str | None, msg_ids: list[int]) -> None:
        page = self.disk[group]
        assert msg_ids == [m.msg_id for m in page[: len(msg_ids)]], "not the group's oldest"
        taken, self.disk[group] = page[: len(msg_ids)], page[len(msg_ids) :]
        fx = Effects()
        assert self.q.unpage(group, msg_ids, taken, self.now, fx)
        self._apply(fx)

    @rule(consumer=st.sampled_from(CONSUMERS), prefetch=st.integers(min_value=1, max_value=4))
    def subscribe(self, consumer: str, prefetch: int) -> None:
        if consumer in self.held:
            return
        self.held[consumer] = {}
        self.prefetch[consumer] = prefetch
        fx = Effects()
        self.q.subscribe(consumer, consumer, prefetch, self.now, fx)
        self._apply(fx)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        consumer = data.draw(st.sampled_from(sorted(self.held)))
        del self.held[consumer]
        fx = Effects()
        self.q.close_consumer(consumer, self.now, fx)
        self._apply(fx)

    def _pick(self, data: st.DataObject) -> tuple[str, list[int]] | None:
        busy = sorted(c for c, h in self.held.items() if h)
        if not busy:
            return None
        consumer = data.draw(st.sampled_from(busy))
        ids = sorted(self.held[consumer])
        chosen = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=3, unique=True))
        return consumer, chosen

    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        picked = self._pick(data)
        if picked:
            consumer, ids = picked
            for did in ids:
                self.held[consumer].pop(did)
            fx = Effects()
            self.q.ack(consumer, ids, self.now, fx)
            self._apply(fx)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        picked = self._pick(data)
        if picked:
            consumer, ids = picked
            fx = Effects()
            self.q.release(consumer, ids, self.now, fx)
            self._forget_returned(consumer)
            self._apply(fx)

    @rule(data=st.data())
    def reject(self, data: st.DataObject) -> None:
        picked = self._pick(data)
        if picked:
            consumer, ids = picked
            for did in ids:
                self.held[consumer].pop(did)
            fx = Effects()
            self.q.reject(consumer, ids, self.now, fx)
            self._apply(fx)

    @rule(group=st.sampled_from([None, "g0", "g1"]))
    def reset(self, group: str | None) -> None:
        known = {g.group for g in self.q.groups()}
        if group is not None and group not in known:
            return
        fx = Effects()
        self.q.reset_groups(group, self.now, fx)
        self._apply(fx)

    @rule(key=st.sampled_from(HOLDABLE))
    def hold(self, key: str) -> None:
        """A clustered node holds a group it has not confirmed (cluster/claims.py)."""
        self.q.hold(key)
        self.on_hold.add(key)

    def _owned_holdable(self) -> list[str]:
        return sorted(i.group for i in self.q.groups() if i.owner and i.group in HOLDABLE)

    @precondition(lambda self: self._owned_holdable())
    @rule(data=st.data())
    def hold_owned(self, data: st.DataObject) -> None:
        """A pinned group's binding is removed (cluster/claims.py `removed`): rare otherwise."""
        self.hold(data.draw(st.sampled_from(self._owned_holdable())))

    @rule(key=st.sampled_from(HOLDABLE))
    def unhold(self, key: str) -> None:
        self.on_hold.discard(key)
        fx = Effects()
        self.q.unhold(key, self.now, fx)
        self._apply(fx)

    @rule(key=st.sampled_from(HOLDABLE))
    def take(self, key: str) -> None:
        """A held group's waiting messages move to another node: they leave for good."""
        if not self.q.held_waiting(key):
            return
        fx = Effects()
        taken = self.q.take_group(key, fx)
        assert taken and all(self.key_of[m.msg_id] == key for m in taken)
        positions = [self.order[m.msg_id] for m in taken]
        assert positions == sorted(positions), "a group's messages left out of order"
        self._apply(fx)

    @rule(ms=st.integers(min_value=1, max_value=100))
    def tick(self, ms: int) -> None:
        self.now += ms * 1_000_000
        fx = Effects()
        self.q.tick(self.now, fx)
        self._apply(fx)

    def _forget_returned(self, consumer: str) -> None:
        """Release may take back more than was named (the rest of the group): resync."""
        still = {did for did, _ in self.q.unacked(consumer)}
        self.held[consumer] = {d: m for d, m in self.held[consumer].items() if d in still}

    # ---- invariants ---------------------------------------------------------------------

    @invariant()
    def ledger_matches_queue(self) -> None:
        if not hasattr(self, "q"):
            return
        for consumer, held in self.held.items():
            assert {d: m.msg_id for d, m in self.q.unacked(consumer)} == held
            assert len(held) <= self.prefetch[consumer]
        assert self.q.depth == self.sent - len(self.settled)
        assert self.q.paged == sum(map(len, self.disk.values()))
        in_memory = self.q.held()  # what the meter counts: paged messages are not in it
        assert self.q.bytes == self.q.meter.bytes == sum(m.size for m in in_memory)
        assert all(m.size > 0 for m in in_memory)

    @invariant()
    def counts_agree_with_a_walk(self) -> None:
        """The figures /metrics reads, kept as messages move, are what walking the queue
        finds; the totals are what the ledger saw."""
        if not hasattr(self, "q"):
            return
        q, groups = self.q, self.q._groups.values()
        c = q.counts()
        assert c.owned == sum(1 for g in groups if g.owner is not None)
        assert c.held == sum(1 for g in groups if g.state & HELD)
        waiting = [g for g in groups if g.owner is None and (g.pending or g.page)]
        assert c.unowned_waiting == len(waiting)
        unacked = [m for cs in q._consumers.values() for m in cs.unacked.values()]
        assert (c.memory_bytes, c.in_flight_bytes) == (q.bytes, sum(m.size for m in unacked))
        totals = q.totals
        assert (totals.enqueued, totals.delivered) == (self.sent, self.deliveries_seen)
        assert totals.acked + totals.dead_lettered <= len(self.settled)  # taken ones too
        assert sum(cs.delivered for cs in q._consumers.values()) <= totals.delivered
        assert sum(cs.acked for cs in q._consumers.values()) <= totals.acked

    @invariant()
    def lagging_groups_are_all_found(self) -> None:
        """With room for every group, the top lagging lists hold every group with a backlog
        past DEEP, and every one in a run queue or held with messages waiting."""
        if not hasattr(self, "q"):
            return
        by_backlog, by_age = self.q.lagging(len(self.q._groups) + 1)
        groups = self.q._groups
        deep = {k for k, g in groups.items() if g.backlog() >= DEEP}
        assert deep <= {r.group for r in by_backlog}
        for r in by_backlog:
            assert r.backlog == groups[r.group].backlog() > 0
        movable = {
            k
            for k, g in groups.items()
            if g.pending is not None and (g.slot is not None or g.state & HELD)
        }
        assert movable <= {r.group for r in by_age}
        assert [r.oldest_ns for r in by_age] == sorted(r.oldest_ns for r in by_age)

    @invariant()
    def one_consumer_per_group(self) -> None:
        if not hasattr(self, "q"):
            return
        holders: dict[str, set[str]] = defaultdict(set)
        for consumer, held in self.held.items():
            for msg_id in held.values():
                key = self.key_of[msg_id]
                if key is not None:
                    holders[key].add(consumer)
        for key, who in holders.items():
            assert len(who) == 1, f"group {key} is out at {who}"

    @invariant()
    def nothing_stuck(self) -> None:
        """While dispatch runs, a consumer with credit never leaves deliverable work waiting."""
        if not hasattr(self, "q") or not self.q._dispatching(self.now):
            return
        hungry = {c for c, h in self.held.items() if len(h) < self.prefetch[c]}
        if not hungry:
            return
        assert not self.q._ungrouped, "ungrouped messages wait while a consumer has credit"
        for info in self.q.groups():
            if self.q._groups[info.group].pending is None:
                continue  # nothing in memory (paged ones wait to be read back)
            if self.q._groups[info.group].state & HELD:
                continue  # waits for its binding to be confirmed, on purpose
            if info.owner is None:
                stalling = {c.consumer_id for c in self.q.consumers(self.now) if c.stalled_ms}
                assert hungry <= stalling, f"unowned group {info.group} waits beside free credit"
                continue
            detached = self.q._groups[info.group].state & DETACHING
            assert detached or info.owner not in hungry, f"{info.group} waits at {info.owner}"

    @invariant()
    def held_groups_stay_held(self) -> None:
        """Held from `hold` until `unhold`, or until the group is forgotten (nothing left)."""
        if not hasattr(self, "q"):
            return
        self.on_hold &= set(self.q._groups)
        held = {key for key, g in self.q._groups.items() if g.state & HELD}
        assert held == self.on_hold

    @invariant()
    def group_states_agree_with_the_facts(self) -> None:
        """Each group's state says what its owner, outstanding and pending messages say."""
        if not hasattr(self, "q"):
            return
        q = self.q
        out: dict[str, int] = defaultdict(int)
        for c in q._consumers.values():
            for m in c.unacked.values():
                if m.group is not None:
                    out[m.group] += 1
        for key, g in q._groups.items():
            state, where = g.state, f"{key} is {state_name(g.state)}"
            assert state & ~(OWNERSHIP | HELD) == 0 and state & OWNERSHIP != OWNERSHIP, where
            assert (state & OWNERSHIP == UNOWNED) == (g.owner is None), f"{where}, owner {g.owner}"
            if g.owner is not None:
                assert g.owner is q._consumers.get(g.owner.id) and g in g.owner.groups, where
            assert g.outstanding == out[key], where
            assert g.outstanding == 0 or state & OWNERSHIP, f"{where} with messages out"
            assert not state & DETACHING or g.outstanding > 0, f"{where} with nothing out"
            assert g.pending is None or g.pending, f"{where} with an empty FIFO"
            if g.slot is not None:
                assert not state & (HELD | DETACHING), f"{where} in a run queue"
                assert g in g.slot, f"{where}: its slot is not its run queue"
            if g.pending is not None and state in (UNOWNED, OWNED):
                run = q._unowned if state == UNOWNED else g.owner.ready  # type: ignore[union-attr]
                assert g.slot is run, f"{where} with messages waiting is not in its run queue"
            if state == UNOWNED:
                assert g.pending or g.page, f"{where}, holds nothing and is not forgotten"
        for c in q._consumers.values():
            assert all(q._groups.get(g.key) is g for g in c.groups), f"{c.id} owns a lost group"
        wanting = q._paging.wanting
        assert all(q._groups.get(g.key) is g and g.page for g in wanting), (
            "a group without a page waits for a read back"
        )
        for g in q._groups.values():
            assert not (g.page and g.pending is None) or g in wanting, f"{g.key} is not wanted"

    def teardown(self) -> None:
        """Liveness: a fresh consumer that acks everything drains the queue completely."""
        if not hasattr(self, "q"):
            return
        for key in HOLDABLE:
            self.unhold(key)
        for consumer in list(self.held):
            del self.held[consumer]
            fx = Effects()
            self.q.close_consumer(consumer, self.now, fx)
            self._apply(fx)
        fx = Effects()
        self.held["drain"], self.prefetch["drain"] = {}, 10_000
        self.q.subscribe("drain", "drain", 10_000, self.now, fx)
        self.held["helper"], self.prefetch["helper"] = {}, 1
        self.q.subscribe("helper", "helper", 1, self.now, fx)  # consumers-before-dispatch: 2
        self._apply(fx)
        for _ in range(200):
            for group, msg_ids in self.q.wanted(100, 10):
                self._read_back(group, msg_ids)
            if self.q.depth == 0:
                break
            for consumer in ("drain", "helper"):
                ids = list(self.held[consumer])
                self.held[consumer].clear()
                fx = Effects()
                self.q.ack(consumer, ids, self.now, fx)
                self._apply(fx)
        assert self.q.depth == 0
        assert self.settled == set(self.key_of)


QueueMachine.TestCase.settings = settings(
    max_examples=1000,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestQueueMachine = pytest.mark.slow(
    QueueMachine.TestCase
)  # hypothesis runs the queue machine for 40 s
