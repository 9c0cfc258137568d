"""The grouping arbiter (pure): examples, then a hypothesis machine against a small ledger.

The machine checks the promise the cluster depends on: whatever interleaving of proposals,
uses, removals, topology reports, clock jumps and restarts, every answer for a key names the
same queue@node until that key's binding is removed, and each kind of removal takes exactly
the bindings it should.
"""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from handler.arbiter import Arbiter
from handler.records import Binding

MS = 1_000_000


def test_first_proposal_wins_and_later_ones_get_it() -> None:
    a = Arbiter(epoch=3, group_timeout_ms=-1, absent_timeout_ms=1000)
    first, accepted = a.propose("g", "orders", "n1", 10)
    assert accepted
    assert first == Binding("g", "orders", "n1", 3)
    again, accepted = a.propose("g", "orders", "n2", 20)
    assert not accepted
    assert again == first
    assert a.lookup("g", "orders") == first
    assert a.lookup("g", "other") is None
    other, accepted = a.propose("g", "other", "n2", 30)  # one group, another queue
    assert accepted and other.node == "n2"


def test_reap_takes_only_bindings_idle_longer_than_group_timeout() -> None:
    a = Arbiter(epoch=1, group_timeout_ms=100, absent_timeout_ms=1000)
    a.propose("old", "q", "n1", 0)
    a.propose("used", "q", "n1", 0)
    a.propose("young", "q", "n1", 50 * MS)
    a.propose("used", "q", "n2", 60 * MS)  # an answered proposal counts as a use
    assert a.reap(100 * MS) == []  # idle exactly group-timeout: not longer
    assert a.reap(100 * MS + 1) == [Binding("old", "q", "n1", 1)]
    assert a.touch([("young", "q"), ("unknown", "q")], 120 * MS) == 1
    assert a.reap(160 * MS) == []
    assert [b.group for b in a.reap(221 * MS)] == ["used", "young"]
    assert len(a) == 0


def test_group_timeout_minus_one_never_reaps() -> None:
    a = Arbiter(epoch=1, group_timeout_ms=-1, absent_timeout_ms=0)
    a.propose("g", "q", "n1", 0)
    assert a.reap(10**18) == []
    assert a.lookup("g", "q") is not None


def test_use_touches_and_a_clock_going_back_does_not_rewind_last_use() -> None:
    a = Arbiter(epoch=1, group_timeout_ms=100, absent_timeout_ms=0)
    a.propose("g", "q", "n1", 0)
    assert a.use("g", "q", 90 * MS) is not None
    assert a.use("nope", "q", 90 * MS) is None
    a.propose("h", "q", "n1", 10 * MS)  # earlier than seen: counts as 90 ms
    assert [(b.group, t) for b, t in a.bindings()] == [("g", 90 * MS), ("h", 90 * MS)]
    assert a.reap(190 * MS + 1) == [Binding("g", "q", "n1", 1), Binding("h", "q", "n1", 1)]


def test_unbind_one_queue_or_every_queue() -> None:
    a = Arbiter(epoch=1, group_timeout_ms=-1, absent_timeout_ms=0)
    for queue in ("q1", "q2", "q3"):
        a.propose("g", queue, "n1", 0)
    a.propose("h", "q1", "n1", 0)
    assert a.unbind("g", "q2") == [Binding("g", "q2", "n1", 1)]
    assert a.unbind("g", "q2") == []
    assert sorted(b.queue for b in a.unbind("g", None)) == ["q1", "q3"]
    assert [b.group for b, _ in a.bindings()] == ["h"]
    new, accepted = a.propose("g", "q1", "n2", 0)
    assert accepted and new.node == "n2"


def test_drop_instance_removes_its_bindings_only() -> None:
    a = Arbiter(epoch=1, group_timeout_ms=-1, absent_timeout_ms=0)
    a.propose("g1", "q", "n1", 0)
    a.propose("g2", "q", "n1", 0)
    a.propose("g3", "q", "n2", 0)
    a.propose("g4", "r", "n1", 0)
    assert [b.group for b in a.drop_instance("q", "n1")] == ["g1", "g2"]
    assert a.drop_instance("q", "n1") == []
    assert sorted(b.group for b, _ in a.bindings()) == ["g3", "g4"]


def test_with_no_absent_timeout_an_absent_instance_keeps_its_bindings() -> None:
    a = Arbiter(epoch=1, group_timeout_ms=-1, absent_timeout_ms=-1)
    a.propose("g1", "q", "n1", 0)
    a.instance_seen("q", "n1", present=False, now_ns=0)
    assert a.next_absent_expiry() is None
    assert a.expire_absent(10**15) == []
    assert a.lookup("g1", "q") == Binding("g1", "q", "n1", 1)


def test_absent_instance_loses_its_bindings_after_the_absent_timeout() -> None:
    a = Arbiter(epoch=1, group_timeout_ms=-1, absent_timeout_ms=50)
    a.propose("g1", "q", "n1", 0)
    a.propose("g2", "q", "n2", 0)
    a.instance_seen("q", "n1", present=False, now_ns=10 * MS)
    a.instance_seen("q", "n2", present=False, now_ns=10 * MS)
    a.instance_seen("q", "n2", present=True, now_ns=20 * MS)  # came back in time
    assert a.next_absent_expiry() == 60 * MS + 1
    assert a.expire_absent(60 * MS) == []
    assert a.expire_absent(60 * MS + 1) == [Binding("g1", "q", "n1", 1)]
    assert a.next_absent_expiry() is None
    # Still absent: a binding made to it now goes at the next expiry run.
    a.propose("g3", "q", "n1", 70 * MS)
    assert a.next_absent_expiry() == 60 * MS + 1
    assert [b.group for b in a.expire_absent(71 * MS)] == ["g3"]
    assert a.lookup("g2", "q") is not None


def test_restored_bindings_wait_for_their_instances_to_show_up() -> None:
    old = Arbiter(epoch=1, group_timeout_ms=1000, absent_timeout_ms=0)
    for group, node in (("g1", "n1"), ("g2", "n2"), ("g3", "n3")):
        old.propose(group, "q", node, 0)
    saved = [b for b, _ in old.bindings()]

    a = Arbiter(epoch=1, group_timeout_ms=1000, absent_timeout_ms=100)
    a.instance_seen("q", "n3", present=True, now_ns=0)  # reported before the restore
    a.restore(saved, 5 * MS)
    assert [(b, t) for b, t in a.bindings()] == [(b, 5 * MS) for b in saved]
    a.instance_seen("q", "n1", present=True, now_ns=50 * MS)
    assert a.propose("g2", "q", "n1", 60 * MS) == (saved[1], False)  # answers meanwhile
    assert a.expire_absent(105 * MS + 1) == [saved[1]]
    assert sorted(b.group for b, _ in a.bindings()) == ["g1", "g3"]
    a.restore([Binding("g1", "q", "n9", 7)], 200 * MS)  # a bound key keeps its binding
    assert a.lookup("g1", "q") == saved[0]


def test_bindings_are_small() -> None:
    a = Arbiter(epoch=1, group_timeout_ms=1000, absent_timeout_ms=1000)
    groups = [f"group-{i:06d}" for i in range(20_000)]
    queue, node = "orders", "node-1"
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i, group in enumerate(groups):
        a.propose(group, queue, node, i)
    per_binding = (tracemalloc.get_traced_memory()[0] - before) / len(groups)
    tracemalloc.stop()
    assert not hasattr(a.lookup(groups[0], queue), "__dict__")
    # Key tuple + entry + binding + dict and index slots, group strings excluded.
    assert per_binding < 400, per_binding


def test_bad_timeouts_are_refused() -> None:
    with pytest.raises(ValueError):
        Arbiter(epoch=1, group_timeout_ms=-2, absent_timeout_ms=0)
    with pytest.raises(ValueError):
        Arbiter(epoch=1, group_timeout_ms=0, absent_timeout_ms=-2)


# ---- stateful --------------------------------------------------------------------------------

GROUPS = ["g0", "g1", "g2", "g3"]
QUEUES = ["qa", "qb"]
NODES = ["n0", "n1", "n2"]
groups = st.sampled_from(GROUPS)
queues = st.sampled_from(QUEUES)
nodes = st.sampled_from(NODES)


class ArbiterMachine(RuleBasedStateMachine):
    """Drives one arbiter; the ledger records what was answered and when keys were used."""

    @initialize(
        group_timeout=st.sampled_from([-1, 0, 5, 20]),
        absent_timeout=st.sampled_from([-1, 0, 10, 30]),
        epoch=st.integers(1, 3),
    )
    def setup(self, group_timeout: int, absent_timeout: int, epoch: int) -> None:
        self.args = (epoch, group_timeout, absent_timeout)
        self.arbiter = Arbiter(*self.args)
        self.timeout = group_timeout * MS
        self.absent_timeout = absent_timeout * MS
        self.now = 0  # what the caller passes: may go back
        self.clock = 0  # what the arbiter sees: never goes back
        self.answer: dict[tuple[str, str], Binding] = {}
        self.last_use: dict[tuple[str, str], int] = {}
        self.present: set[tuple[str, str]] = set()
        self.absent: dict[tuple[str, str], int] = {}

    def _t(self) -> int:
        self.clock = max(self.clock, self.now)
        return self.now

    def _removed(self, removed: list[Binding], expected: set[tuple[str, str]]) -> None:
        assert {b.key for b in removed} == expected
        assert len(removed) == len(expected)
        for b in removed:
            assert b == self.answer.pop(b.key), "removed a binding nobody was told about"
            del self.last_use[b.key]

    # ---- steps ------------------------------------------------------------------------

    @rule(group=groups, queue=queues, node=nodes)
    def propose(self, group: str, queue: str, node: str) -> None:
        binding, accepted = self.arbiter.propose(group, queue, node, self._t())
        key = (group, queue)
        if key in self.answer:
            assert not accepted
            assert binding == self.answer[key], "two answers for one key"
        else:
            assert accepted
            assert binding == Binding(group, queue, node, self.args[0])
            self.answer[key] = binding
        self.last_use[key] = self.clock

    @rule(group=groups, queue=queues)
    def use(self, group: str, queue: str) -> None:
        binding = self.arbiter.use(group, queue, self._t())
        assert binding == self.answer.get((group, queue))
        if binding is not None:
            self.last_use[(group, queue)] = self.clock

    @rule(keys=st.lists(st.tuples(groups, queues), max_size=4))
    def touch(self, keys: list[tuple[str, str]]) -> None:
        touched = self.arbiter.touch(keys, self._t())
        assert touched == sum(1 for k in keys if k in self.answer)
        for key in keys:
            if key in self.answer:
                self.last_use[key] = self.clock

    @rule(group=groups, queue=st.none() | queues)
    def unbind(self, group: str, queue: str | None) -> None:
        expected = {k for k in self.answer if k[0] == group and queue in (None, k[1])}
        self._removed(self.arbiter.unbind(group, queue), expected)

    @rule(queue=queues, node=nodes)
    def drop_instance(self, queue: str, node: str) -> None:
        expected = {k for k, b in self.answer.items() if b.instance == (queue, node)}
        self._removed(self.arbiter.drop_instance(queue, node), expected)
        self.present.discard((queue, node))
        self.absent.pop((queue, node), None)

    @rule(queue=queues, node=nodes, present=st.booleans())
    def instance_seen(self, queue: str, node: str, present: bool) -> None:
        self.arbiter.instance_seen(queue, node, present, self._t())
        instance = (queue, node)
        if present:
            self.present.add(instance)
            self.absent.pop(instance, None)
        else:
            self.present.discard(instance)
            self.absent.setdefault(instance, self.clock)

    @rule()
    def expire_absent(self) -> None:
        now = self._t()
        removed = self.arbiter.expire_absent(now)
        gone = {
            i
            for i, since in self.absent.items()
            if self.absent_timeout >= 0 and self.clock - since > self.absent_timeout
        }
        self._removed(removed, {k for k, b in self.answer.items() if b.instance in gone})

    @rule()
    def reap(self) -> None:
        removed = self.arbiter.reap(self._t())
        if self.timeout < 0:
            expected: set[tuple[str, str]] = set()
        else:
            expected = {k for k, t in self.last_use.items() if self.clock - t > self.timeout}
        self._removed(removed, expected)

    @rule(ns=st.integers(0, 40 * MS) | st.sampled_from([1, MS]))
    def advance(self, ns: int) -> None:
        self.now += ns

    @rule(which=st.sampled_from(["group", "absent"]), extra=st.sampled_from([0, 1]))
    def advance_to_a_boundary(self, which: str, extra: int) -> None:
        self.now = self.clock + max(0, self.timeout if which == "group" else self.absent_timeout)
        self.now += extra

    @rule(ns=st.integers(1, 30 * MS))
    def clock_goes_back(self, ns: int) -> None:
        self.now = max(0, self.now - ns)

    @rule()
    def restart(self) -> None:
        saved = [b for b, _ in self.arbiter.bindings()]
        self.arbiter = Arbiter(*self.args)
        self.arbiter.restore(saved, self.now)
        self.clock = self.now  # a new process: its clock starts at what it is given
        self.last_use = dict.fromkeys(self.answer, self.clock)
        self.present = set()
        self.absent = {b.instance: self.clock for b in self.answer.values()}

    # ---- invariants -------------------------------------------------------------------

    @invariant()
    def answers_agree(self) -> None:
        for group in GROUPS:
            for queue in QUEUES:
                assert self.arbiter.lookup(group, queue) == self.answer.get((group, queue))
        listed = self.arbiter.bindings()
        assert {b.key: b for b, _ in listed} == self.answer
        assert {b.key: t for b, t in listed} == self.last_use
        assert len(self.arbiter) == len(self.answer)


ArbiterMachine.TestCase.settings = settings(
    max_examples=400,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestArbiter = pytest.mark.slow(
    ArbiterMachine.TestCase
)  # hypothesis runs the arbiter machine for 20 s
