"""A group's state machine (broker/group_state.py): every transition the module doc lists,
where the queue takes it, and that any other raises instead of corrupting the queue.

The stateful test (test_queue_stateful.py) checks after every random step that each group's
state agrees with its owner, outstanding and pending messages; these pin the listed paths.
"""

from __future__ import annotations

import re

import pytest
from queue_harness import Harness, to

from broker.effects import Effects
from broker.group_state import (
    DETACHING,
    HELD,
    OWNED,
    UNOWNED,
    Consumer,
    Group,
    IllegalTransition,
    state_name,
)

STATES = [s | held for s in (UNOWNED, OWNED, DETACHING) for held in (0, HELD)]
# The module doc's transitions: (name, from, to).
LEGAL = [
    ("pin", UNOWNED, OWNED),
    *(("detach", OWNED | h, DETACHING | h) for h in (0, HELD)),
    *(("unpin", s | h, UNOWNED | h) for s in (OWNED, DETACHING) for h in (0, HELD)),
    *(("hold", s, s | HELD) for s in (UNOWNED, OWNED, DETACHING)),
    *(("unhold", s | HELD, s) for s in (UNOWNED, OWNED, DETACHING)),
]


def _id(value: object) -> str:
    return state_name(value) if isinstance(value, int) else str(value)


def _group_in(state: int) -> tuple[Group, Consumer]:
    c = Consumer("c", "c", 1, 0)
    g = Group("g")
    if state & (OWNED | DETACHING):
        g.pin(c)
    if state & DETACHING:
        g.detach()
    if state & HELD:
        g.hold()
    assert g.state == state
    return g, c


def _take(g: Group, c: Consumer, transition: str) -> None:
    if transition == "pin":
        g.pin(c)
    else:
        getattr(g, transition)()


@pytest.mark.parametrize(("transition", "start"), [(t, s) for t, s, _ in LEGAL], ids=_id)
def test_each_listed_transition_goes_where_the_table_says(transition: str, start: int) -> None:
    g, c = _group_in(start)
    _take(g, c, transition)
    end = dict(((t, s), e) for t, s, e in LEGAL)[transition, start]
    assert state_name(g.state) == state_name(end)
    assert (g.owner is c) == bool(end & (OWNED | DETACHING)) == (g in c.groups)


@pytest.mark.parametrize(
    ("transition", "start"),
    [
        (t, s)
        for t in ("pin", "detach", "unpin", "hold", "unhold")
        for s in STATES
        if (t, s) not in {(t2, s2) for t2, s2, _ in LEGAL}
    ],
    ids=_id,
)
def test_every_other_transition_raises_and_changes_nothing(transition: str, start: int) -> None:
    g, c = _group_in(start)
    owner, groups = g.owner, set(c.groups)
    with pytest.raises(
        IllegalTransition, match=re.escape(f"no {transition} from {state_name(start)}")
    ):
        _take(g, c, transition)
    assert (g.state, g.owner, c.groups) == (start, owner, groups)


# ---- where the queue takes them ----------------------------------------------------------


def test_pin_gives_a_new_group_to_a_consumer_and_marks_that_delivery_first() -> None:
    h = Harness()
    h.sub("c1")
    h.send("A")
    assert (h.state("A"), h.owner("A")) == ("OWNED", "c1")
    h.send("A")
    assert [d.first_in_group for d in h.log] == [True, False]


def test_reset_with_messages_out_detaches_and_the_last_settle_unpins() -> None:
    h = Harness()
    h.sub("c1")
    h.send("A")
    h.reset("A")
    assert h.state("A") == "DETACHING"
    a2, fx = h.send("A")
    assert to(fx, "c1") == []  # a detaching group delivers nothing
    fx = h.ack("c1")
    assert h.state("A") == "OWNED"  # unpinned, then pinned anew: a first delivery again
    assert [(d.message.msg_id, d.first_in_group) for d in fx.deliveries] == [(a2.msg_id, True)]


def test_a_closing_message_detaches_its_group_and_its_ack_forgets_it() -> None:
    h = Harness()
    h.sub("c1")
    h.send("A", seq=-1)
    assert h.state("A") == "DETACHING"
    h.ack("c1")
    assert h.state("A") is None  # unpinned with nothing left: forgotten


def test_unpin_in_shared_mode_once_nothing_is_out() -> None:
    h = Harness(group_mode="shared")
    h.sub("c1", prefetch=1)
    h.send("A")
    h.send("A")
    h.ack("c1")  # the next one is delivered at once: pinned again
    assert h.state("A") == "OWNED"
    h.ack("c1")
    assert h.state("A") is None


def test_unpin_when_the_owner_closes_leaves_the_group_unowned_with_its_messages() -> None:
    h = Harness()
    h.sub("c1")
    h.send("A")
    h.close("c1")
    assert (h.state("A"), h.owner("A")) == ("UNOWNED", None)


def test_reset_with_nothing_out_unpins_at_once() -> None:
    h = Harness()
    h.sub("c1")
    h.send("A")
    h.ack("c1")
    assert h.state("A") == "OWNED"  # sticky: an idle group stays pinned
    h.reset("A")
    assert h.state("A") is None


def test_hold_and_unhold_keep_the_owner_and_the_detaching() -> None:
    h = Harness()
    h.q.hold("A")
    h.q.hold("A")  # holding a held group does nothing
    assert h.state("A") == "UNOWNED+HELD"
    h.sub("c1")
    h._run(h.q.unhold, "A")
    assert h.state("A") is None  # unheld with nothing: forgotten
    h.send("A")
    h.q.hold("A")
    assert h.state("A") == "OWNED+HELD"
    h._run(h.q.unhold, "A")
    assert (h.state("A"), h.owner("A")) == ("OWNED", "c1")
    h.q.hold("A")
    h.reset("A")
    assert h.state("A") == "DETACHING+HELD"
    h.ack("c1")
    assert h.state("A") is None  # unpinned with nothing left, held or not


def test_take_group_forgets_a_held_owned_group_with_nothing_out() -> None:
    h = Harness()
    h.sub("c1", prefetch=1)
    h.send("A")
    h.ack("c1")
    h.q.hold("A")
    assert h.state("A") == "OWNED+HELD"
    assert h.q.take_group("A", Effects()) == []
    assert h.state("A") is None and h.q.consumer_groups("c1") == []


def test_a_bug_that_asks_for_an_illegal_transition_raises() -> None:
    h = Harness()
    h.sub("c1")
    h.send("A")
    with pytest.raises(IllegalTransition, match="'A': no pin from OWNED"):
        h.q._groups["A"].pin(h.q._consumers["c1"])
