"""`GET /metrics` of real node processes, read with prometheus-client's own parser: the figures
move with real traffic (sends, deliveries, acks, consumers, connections, a peer going away)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cluster_nodes import ClusterNodes, grouping
from conftest import NodeProcess, Scrape, scrape, unique
from stomp_helpers import Raw
from waiting import until, wait

from broker.client import Client
from broker.client.errors import NotFound

QUEUE = (
    "pinmq_queue_pending_messages",
    "pinmq_queue_in_flight_messages",
    "pinmq_queue_paged_messages",
    "pinmq_queue_consumers",
    "pinmq_queue_groups",
)


def figures(s: Scrape, queue: str) -> tuple[float, ...]:
    """(pending, in flight, paged, consumers, groups) of `queue`."""
    return tuple(s.value(name, queue=queue) for name in QUEUE)


async def test_a_queue_s_figures_follow_its_messages_from_send_to_ack(
    node_factory: Callable[..., NodeProcess],
) -> None:
    node = node_factory()
    node_id, queue = f"test-{node.port}", unique("metrics")
    async with Client(node.url) as client:
        for group in ("alice", "bob", "carol"):
            await client.producer(queue, group_id=group).send_many([group] * 10)
        sent = scrape(node.http)
        assert figures(sent, queue) == (30, 0, 0, 0, 3)
        assert {s.labels["node"] for s in sent.samples} == {node_id}
        assert sent.value("pinmq_memory_used_bytes") > 0
        assert sent.value("pinmq_memory_limit_bytes") > 0
        assert 0 <= sent.value("pinmq_disk_usage_ratio") <= 1
        assert sent.value("pinmq_disk_usage_limit_ratio") == 0.9
        assert sent.value("pinmq_blocked_producers") == 0
        assert sent.value("pinmq_duplicates_dropped_total") == 0
        assert sent.labels("pinmq_peer_linked") == sent.labels("pinmq_ha_role") == []
        assert sent.labels("pinmq_audit_written_events_total") == []  # no audit log here

        async with client.consumer(queue, prefetch=100) as consumer:
            got = [await consumer.receive(timeout=30) for _ in range(30)]
            assert all(got)
            assert figures(scrape(node.http), queue) == (0, 30, 0, 1, 3)
            await consumer.ack_many(got, wait=True)  # type: ignore[arg-type]
            acked = scrape(node.http)
            # Each group stays pinned to its consumer, with nothing left to hold.
            assert figures(acked, queue) == (0, 0, 0, 1, 3)
            assert acked.value("pinmq_memory_used_bytes") == 0
        await until(
            "the consumer, and its groups with it, gone",
            lambda: figures(scrape(node.http), queue) == (0, 0, 0, 0, 0),
        )


async def test_a_stuck_group_tops_the_lists_with_its_owner_and_the_totals_move(
    node_factory: Callable[..., NodeProcess],
) -> None:
    """A consumer that takes one message of group `stuck` and never acks it: `stuck` heads
    the top groups by backlog and by age, named with its owner, and its age grows; groups,
    totals, latencies and the consumer's own figures say what happened."""
    node = node_factory()
    queue = unique("stuck")
    async with Client(node.url) as client:
        await client.producer(queue, group_id="stuck").send_many(["s"] * 10)
        for group in ("g1", "g2", "g3"):
            await client.producer(queue, group_id=group).send(group)
        async with client.consumer(queue, name="slowpoke", prefetch=1) as consumer:
            first = await consumer.receive(timeout=30)
            assert first is not None and first.group_id == "stuck"
            s = scrape(node.http)
            top = {"queue": queue, "group": "stuck", "owner": "slowpoke", "held": "false"}
            assert s.value("pinmq_top_group_backlog_messages", **top) == 9
            ages = {
                x.labels["group"]: x.value
                for x in s.samples
                if x.name == "pinmq_top_group_oldest_age_seconds" and x.labels["queue"] == queue
            }
            assert set(ages) == {"stuck", "g1", "g2", "g3"}  # each waits, stuck the longest
            assert max(ages, key=ages.__getitem__) == "stuck"
            age = s.value("pinmq_top_group_oldest_age_seconds", **top)
            await until(
                "the stuck group's age grows",
                lambda: scrape(node.http).value("pinmq_top_group_oldest_age_seconds", **top) > age,
            )
            groups = [
                s.value(f"pinmq_queue_groups_{k}", queue=queue)
                for k in ("owned", "unowned_waiting", "held")
            ]
            assert groups == [1, 3, 0]
            # The queue's oldest message is the one out to slowpoke, older than any waiting.
            oldest = s.value("pinmq_queue_oldest_message_age_seconds", queue=queue)
            assert oldest >= age > 0
            assert s.value("pinmq_queue_in_flight_bytes", queue=queue) > 0
            mine = {"queue": queue, "consumer": "slowpoke"}
            assert s.value("pinmq_consumer_unacked_messages", **mine) == 1
            assert s.value("pinmq_consumer_delivered_messages_total", **mine) == 1
            await first.ack(wait=True)
            for _ in range(12):  # one at a time: prefetch 1
                m = await consumer.receive(timeout=30)
                assert m is not None
                await m.ack(wait=True)
            s = scrape(node.http)
            assert s.value("pinmq_consumer_acked_messages_total", **mine) == 13
        totals = [
            s.value(f"pinmq_queue_{k}_messages_total", queue=queue)
            for k in ("enqueued", "delivered", "acked", "redelivered")
        ]
        assert totals == [13, 13, 13, 0]
        first_delivery = "pinmq_queue_enqueue_to_first_delivery_seconds"
        assert s.value(f"{first_delivery}_count", queue=queue) == 13
        assert s.value(f"{first_delivery}_bucket", queue=queue, le="+Inf") == 13
        assert s.value("pinmq_queue_enqueue_to_ack_seconds_sum", queue=queue) > 0
        assert s.labels("pinmq_top_group_backlog_messages") == []  # nothing waits any more
        assert s.value("pinmq_queue_oldest_message_age_seconds", queue=queue) == 0


async def test_refused_requests_are_counted_by_protocol_and_reason(
    node_factory: Callable[..., NodeProcess],
) -> None:
    """A send to a queue that does not exist (auto-create off) and a broken STOMP frame."""
    node = node_factory({"address-settings": {"#": {"auto-create-queues": False}}})

    def refused(protocol: str, reason: str) -> float:
        s = scrape(node.http)
        return s.value("pinmq_refused_requests_total", protocol=protocol, reason=reason)

    assert scrape(node.http).labels("pinmq_refused_requests_total") == []
    async with Client(node.url) as client:
        for _ in range(2):
            with pytest.raises(NotFound):
                await client.producer("nowhere").send(b"x")
    assert refused("grpc", "NOT_FOUND") == 2
    with Raw(node.stomp_port) as raw:
        raw.connect()
        raw.send(b"SUBSCRIBE\nid:1\ndestination:q\nack:sometimes\n\n\x00")
        assert raw.frame().command == "ERROR"
    assert refused("stomp", "INVALID_ARGUMENT") == 1


async def test_the_audit_log_s_writer_is_counted(
    node_factory: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    node = node_factory({"audit": {"enabled": True, "dir": str(tmp_path / "audit")}})
    assert scrape(node.http).value("pinmq_audit_dropped_events_total") == 0
    async with Client(node.url) as client:
        await client.producer(unique("audited"), group_id="g").send_many(["a"] * 5)

    def written() -> float:
        s = scrape(node.http)
        return (
            s.value("pinmq_audit_written_events_total")
            if s.value("pinmq_audit_backlog_entries") == 0
            else 0
        )

    await until("the 5 sends written to the audit log", lambda: written() >= 5)
    assert scrape(node.http).value("pinmq_audit_dropped_events_total") == 0


async def test_open_connections_are_counted_per_protocol(
    node_factory: Callable[..., NodeProcess],
) -> None:
    node = node_factory()

    def connections(protocol: str) -> float:
        return scrape(node.http).value("pinmq_connections", protocol=protocol)

    assert connections("stomp") == 0
    with Raw(node.stomp_port) as raw:
        raw.connect()
        assert connections("stomp") == 1
    wait("the STOMP connection closed", lambda: connections("stomp") == 0)
    # One TCP connection per client process (its channels to one address share it).
    await until("the test's readiness probe gone", lambda: connections("grpc") == 0)
    async with Client(node.url) as client:
        await client.queues()
        assert connections("grpc") == 1
    await until("the gRPC connection closed", lambda: connections("grpc") == 0)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[ClusterNodes]:
    nodes = ClusterNodes(tmp_path, grouping(["n1", "n2"]))
    yield nodes.start()
    nodes.kill_all()


async def test_links_the_grouping_handler_and_store_and_forward_of_a_cluster(
    pair: ClusterNodes,
) -> None:
    n1, n2 = pair.nodes["n1"], pair.nodes["n2"]
    for node, node_id, peer, handler in ((n1, "n1", "n2", "LOCAL"), (n2, "n2", "n1", "REMOTE")):
        s = scrape(node.http)
        assert s.value("pinmq_peer_linked", node=node_id, peer=peer) == 1
        assert s.labels("pinmq_grouping_handler_info") == [{"node": node_id, "type": handler}]

    # Group g is bound to q@n2, where its consumer is; one message goes there from n1.
    queue = unique("metrics")
    async with pair.client("n2") as client:
        await client.create_queue(queue)
        async with client.consumer(queue) as consumer:
            pair.wait_consumers(queue, {"n2": 1})
            async with pair.client("n1") as sender:
                await sender.producer(queue, group_id="g").send("first")
            first = await consumer.receive(timeout=30)
            assert first is not None and first.group_id == "g"
            await first.ack(wait=True)

    # n2 asked n1 (LOCAL) for g's binding once; n1 made it, durable, at its arbiter's epoch.
    s1, s2 = scrape(n1.http), scrape(n2.http)
    assert s2.value("pinmq_grouping_proposals_total") == 1
    assert s2.value("pinmq_grouping_decision_seconds_count") == 1
    assert s1.value("pinmq_grouping_proposals_total") >= 1  # n2's, and n1's own if it asked
    assert s1.value("pinmq_grouping_bindings_created_total") == 1
    assert s1.value("pinmq_grouping_bindings") == 1
    assert s1.value("pinmq_grouping_arbiter_epoch") >= 1
    assert (
        s1.value("pinmq_grouping_timeouts_total") == s2.value("pinmq_grouping_timeouts_total") == 0
    )
    assert s2.labels("pinmq_grouping_bindings") == []  # a REMOTE node holds none
    # No rebind-absent-after: leases are off, the REMOTE node delivers without one.
    assert s2.value("pinmq_grouping_lease_held") == 1
    assert s2.value("pinmq_grouping_lease_lapses_total") == 0
    assert s1.labels("pinmq_grouping_lease_held") == []
    commits = s2.value("pinmq_store_commit_seconds_count")
    assert commits > 0 and s2.value("pinmq_store_commit_operations_count") == commits
    assert s2.value("pinmq_store_commit_seconds_bucket", le="+Inf") == commits

    def forwarding() -> float:
        return scrape(n1.http).value("pinmq_store_and_forward_messages", peer="n2")

    await until("n1's store-and-forward queue to n2 drained", lambda: forwarding() == 0)
    pair.stop("n2")
    await until("n1 sees n2 gone", lambda: scrape(n1.http).value("pinmq_peer_linked") == 0)
    async with pair.client("n1") as sender:
        await sender.producer(queue, group_id="g").send_many(["while n2 is away"] * 5)
    assert forwarding() == 5  # they wait for n2, in order

    s1 = scrape(n1.http)
    assert s1.value("pinmq_store_and_forward_oldest_age_seconds", peer="n2") > 0
    confirmed = s1.value("pinmq_bridge_confirmed_messages_total", peer="n2")
    assert confirmed >= 1  # "first"

    pair.start("n2")
    await until("n1 forwarded them to n2", lambda: forwarding() == 0)
    assert scrape(n2.http).value("pinmq_queue_pending_messages", queue=queue) == 5
    s1 = scrape(n1.http)
    assert s1.value("pinmq_bridge_confirmed_messages_total", peer="n2") == confirmed + 5
    assert s1.value("pinmq_bridge_forwarded_messages_total", peer="n2") >= confirmed + 5
    assert s1.value("pinmq_store_and_forward_oldest_age_seconds", peer="n2") == 0
    assert scrape(n2.http).value("pinmq_forward_duplicates_total") == 0
