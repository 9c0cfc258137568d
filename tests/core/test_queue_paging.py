"""Paging in the pure queue core: per group, read back oldest first, and spilled back when
its owner cannot take more, so memory goes to the groups that can move."""

from __future__ import annotations

from array import array

from broker.config import QueueConfig
from broker.effects import Effects
from broker.message import GROUP_ID_HEADER, Message
from broker.queue import Queue


def send(q: Queue, msg_id: int, group: str, may_page: bool = False) -> bool:
    m = Message(msg_id, "q", "q", b"x", {GROUP_ID_HEADER: group}, persistent=True)
    return q.enqueue(m, 0, Effects(), may_page)


def counts(q: Queue) -> tuple[int, ...]:
    """pending, in flight, paged, consumers, groups (tests/core/test_queue_metrics.py checks
    the rest)."""
    c = q.counts()
    return (c.pending, c.in_flight, c.paged, c.consumers, c.groups)


def stored(msg_ids: list[int], group: str) -> list[Message]:
    """The messages as the store gives them back."""
    return [Message(i, "q", "q", b"x", {GROUP_ID_HEADER: group}, persistent=True) for i in msg_ids]


def test_a_group_pages_behind_its_first_paged_message_and_reads_back_in_order() -> None:
    q = Queue("q", "q", QueueConfig())
    assert not send(q, 1, "a")
    assert send(q, 2, "a", may_page=True)
    assert send(q, 3, "a")  # the address has room again, but it must not overtake 2
    assert not send(q, 4, "b")  # another group is not held back
    assert (q.paged, q.depth) == (2, 4)
    assert counts(q) == (4, 0, 2, 0, 2)
    fx = Effects()
    q.subscribe("c", "c", 10, 0, fx)
    assert [d.message.msg_id for d in fx.deliveries] == [1, 4]
    assert counts(q) == (2, 2, 2, 1, 2)
    assert q.wanted(10, 10) == [("a", [2, 3])]
    fx = Effects()
    assert q.unpage("a", [2, 3], stored([2, 3], "a"), 0, fx)
    assert [d.message.msg_id for d in fx.deliveries] == [2, 3]
    assert (q.paged, q.wanted(10, 10)) == (0, [])
    assert not q.unpage("a", [2, 3], stored([2, 3], "a"), 0, Effects())  # a stale read


def test_a_stuck_owner_spills_its_waiting_messages_in_front_of_its_page() -> None:
    q = Queue("q", "q", QueueConfig())
    fx = Effects()
    q.subscribe("stuck", "stuck", 1, 0, fx)
    for i in (1, 2, 3):
        send(q, i, "a")
    assert send(q, 4, "a", may_page=True)
    before = q.meter.bytes
    spilled = q.spill(writing={3}, wanted_bytes=10**6)  # 3's write is not committed yet
    assert spilled == []  # the newest waiting one cannot go, so none behind it either
    spilled = q.spill(writing=(), wanted_bytes=10**6)
    assert [m.msg_id for m in spilled] == [3, 2]  # newest first; 1 is at the consumer
    assert q.meter.bytes == before - sum(m.size for m in spilled)
    assert (q.paged, q.depth) == (3, 4)
    assert counts(q) == (3, 1, 3, 1, 1)
    assert q.wanted(10, 10) == []  # its owner has no credit: nothing to read back yet
    fx = Effects()
    q.ack("stuck", [1], 0, fx)
    assert (q.totals.enqueued, q.totals.acked) == (4, 1)
    assert q.wanted(10, 10) == [("a", [2, 3, 4])]  # oldest first, the spilled ones in front


def test_a_held_group_is_read_back_with_no_consumer_to_be_moved_on() -> None:
    q = Queue("q", "q", QueueConfig())
    q.restore_paged("a", array("q", [1]), 0)  # as a restart restores a stored group: paged
    q.restore_paged("b", array("q", [2]), 0)
    assert (q.paged, q.wanted(10, 10)) == (2, [])  # nobody could take them
    q.hold("a")  # its binding is not confirmed yet: it may have to move to another node
    assert q.wanted(10, 10) == [("a", [1])]
    fx = Effects()
    assert q.unpage("a", [1], stored([1], "a"), 0, fx)
    assert fx.deliveries == []
    assert [m.msg_id for m in q.take_group("a", fx)] == [1]
    assert (q.paged, q.depth) == (1, 1)
