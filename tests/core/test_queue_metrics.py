"""What a queue counts for /metrics: group states, bytes, totals, latencies, and its most
lagging groups, found without walking them all."""

from __future__ import annotations

from broker.config import QueueConfig
from broker.dispatch import DEEP, DEEP_CAP
from broker.effects import Effects
from broker.message import GROUP_ID_HEADER, Message
from broker.queue import Queue
from broker.queue_stats import LATENCY_BOUNDS_NS

MS = 1_000_000


def send(q: Queue, msg_id: int, group: str, now_ns: int, may_page: bool = False) -> None:
    headers = {GROUP_ID_HEADER: group}
    m = Message(msg_id, "q", "q", b"x" * 10, headers, persistent=True, enqueued_ns=now_ns)
    q.enqueue(m, now_ns, Effects(), may_page)


def delivered(q: Queue, consumer: str, prefetch: int, now_ns: int) -> list[int]:
    """Subscribe `consumer`; the delivery ids it got."""
    fx = Effects()
    q.subscribe(consumer, consumer, prefetch, now_ns, fx)
    return [d.delivery_id for d in fx.deliveries]


def test_group_states_bytes_and_totals_move_with_the_messages() -> None:
    q = Queue("q", "q", QueueConfig())
    for i, group in enumerate(["a", "a", "b", "c"], start=1):
        send(q, i, group, now_ns=0)
    q.hold("c")
    c = q.counts()
    assert (c.groups, c.owned, c.unowned_waiting, c.held) == (3, 0, 3, 1)
    assert c.memory_bytes == q.bytes > 0 and c.in_flight_bytes == 0
    ids = delivered(q, "c1", prefetch=2, now_ns=3 * MS)  # both of a: it is pinned to c1
    c = q.counts()
    assert (c.owned, c.unowned_waiting, c.held, c.in_flight) == (1, 2, 1, 2)
    assert c.in_flight_bytes == 2 * c.memory_bytes // 4  # two of four equal messages
    fx = Effects()
    q.release("c1", [ids[1]], 4 * MS, fx)  # a's second comes back, is delivered again
    q.ack("c1", ids[:1], 40 * MS, fx)
    totals = q.totals
    assert (totals.enqueued, totals.acked, totals.dead_lettered) == (4, 1, 0)
    assert (totals.delivered, totals.redelivered) == (4, 1)  # b goes out after the ack
    # 3 ms from enqueue to the first deliveries, 40 ms to the ack: counted in their buckets.
    assert totals.to_first_delivery.counts[LATENCY_BOUNDS_NS.index(5 * MS)] == 2
    assert totals.to_ack.counts[LATENCY_BOUNDS_NS.index(100 * MS)] == 1
    assert totals.to_ack.sum == 40 * MS
    (consumer,) = q.consumers(40 * MS)
    assert (consumer.delivered, consumer.acked) == (totals.delivered, 1)


def test_a_group_stuck_behind_a_stalled_owner_leads_both_lists_among_many() -> None:
    """Among 10,000 groups of one message, half of them waiting for a busy consumer, the one
    group whose owner stops acking is on top by backlog and by age, with its owner's name."""
    q = Queue("q", "q", QueueConfig(slow_consumer_threshold=-1))
    delivered(q, "stuck", prefetch=1, now_ns=0)
    send(q, 1, "slow", now_ns=0)  # goes to `stuck`, which never acks it
    for i in range(2, 2 + 3 * DEEP):
        send(q, i, "slow", now_ns=i * MS)  # waits behind it
    delivered(q, "busy", prefetch=5_000, now_ns=0)
    for i in range(10_000):
        send(q, 100 + i, f"g{i}", now_ns=10_000 * MS)
    by_backlog, by_age = q.lagging(3)
    assert by_backlog[0].group == by_age[0].group == "slow"
    assert by_backlog[0].backlog == 3 * DEEP and by_backlog[0].owner_name == "stuck"
    assert by_age[0].oldest_ns == 2 * MS  # its oldest waiting message (1 is out)
    assert len(by_backlog) == len(by_age) == 3


def test_a_group_deepened_by_a_return_is_a_candidate() -> None:
    """A release puts several messages back at once: no doubling of the backlog is seen on
    the way, yet the group is found."""
    q = Queue("q", "q", QueueConfig())
    for i in range(DEEP - 1):
        send(q, i + 1, "a", now_ns=0)
    ids = delivered(q, "c", prefetch=DEEP, now_ns=0)
    for i in range(3):
        send(q, 100 + i, "a", now_ns=0)  # backlog 3, then the return makes it 3 + DEEP - 1
    q.release("c", ids[:1], 0, Effects())
    q.close_consumer("c", 0, Effects())
    q.hold("a")  # out of every run queue: only the deep candidates can show it
    by_backlog, _ = q.lagging(1)
    assert [(r.group, r.backlog, r.held) for r in by_backlog] == [("a", DEEP + 2, True)]


def test_paged_backlogs_are_ranked_and_candidates_stay_bounded() -> None:
    q = Queue("q", "q", QueueConfig())
    for g in range(DEEP_CAP + 10):
        for i in range(DEEP):
            send(q, g * DEEP + i, f"g{g}", now_ns=0, may_page=True)
    send(q, 10**9, "g7", now_ns=0, may_page=True)  # one more: g7 is the deepest
    assert len(q._deep) <= DEEP_CAP
    by_backlog, by_age = q.lagging(2)
    assert by_backlog[0].group == "g7" and by_backlog[0].backlog == DEEP + 1
    assert by_age == []  # paged heads have no age in memory: they show by backlog
