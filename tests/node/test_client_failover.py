"""A client given several addresses moves to the next node when its own goes: real node
processes, killed and restarted.

Standalone nodes that share nothing stand in for a node and its backup, so what is checked is
what the client does: where it connects, that consumers go on, and that a send cut short goes
again as the very same messages (the same `_AMQ_DUPL_ID` and JMSXGroupSeq). No test asserts
on timing: every wait is a bounded guard.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from conftest import PINMQ, NodeProcess, cli, create_on, depth, drain, unique

from broker.audit import read_events, segments
from broker.client import (
    Client,
    ConnectionLost,
    InvalidArgument,
    OutcomeUnknown,
    Received,
    Unavailable,
)
from broker.client.errors import from_rpc
from broker.message import DUPLICATE_ID_HEADER

GUARD_S = 60.0

Nodes = Callable[..., NodeProcess]


def duplicate_ids(messages: list[Received]) -> dict[int, str]:
    """JMSXGroupSeq -> `_AMQ_DUPL_ID`, checking that no sequence number came twice."""
    ids = {m.group_seq: m.headers[DUPLICATE_ID_HEADER] for m in messages}
    assert len(ids) == len(messages)
    return ids


@pytest.mark.slow
async def test_the_client_follows_its_nodes_and_gives_up_once_none_is_left(
    node_factory: Nodes,
) -> None:
    a, b, c = node_factory(), node_factory(), node_factory()
    queue = unique()
    await create_on(queue, b, c)
    notices: list[str] = []
    url = f"{a.url},{b.url},{c.url}"
    async with Client(url, failover_timeout=2, on_failover=notices.append) as client:
        assert client.target == a.url
        producer = client.producer(queue)
        a.kill()
        await producer.send("to b")  # the send finds a gone, and goes again at b
        assert client.target == b.url
        with pytest.raises(InvalidArgument, match="empty address"):
            await client.producer("").send("refused, so never sent again")
        b.kill()
        assert queue in [q.name for q in await client.queues()]  # asked again, at c
        assert client.target == c.url
        assert notices == [
            f"lost the connection to {a.url}; now connected to {b.url}",
            f"lost the connection to {b.url}; now connected to {c.url}",
        ]
        c.kill()
        # Unavailable: ConnectionLost, or OutcomeUnknown if the call left before c was seen gone.
        with pytest.raises(Unavailable, match=r"cannot reach a pinmq node at .* within 2 s"):
            await client.queues()
        with pytest.raises(ConnectionLost, match="nothing was sent"):
            await producer.send("nowhere")
    b.start()
    # Trying again for a while: this process's last connection attempts to b were refused,
    # and gRPC's shared subchannel may report that for up to its reconnect backoff (1 s).
    async with Client(b.url, failover_timeout=GUARD_S) as client:
        assert [m.text for m in await drain(client, queue)] == ["to b"]
    with pytest.raises(ConnectionLost, match=rf"at {a.url}, {c.url} within 0\.5 s"):
        async with Client(f"{a.url},{c.url}", failover_timeout=0.5):
            pass


async def test_a_consumer_goes_on_at_the_next_node_and_its_stale_messages_cannot_be_settled(
    node_factory: Nodes,
) -> None:
    a, b = node_factory(), node_factory()
    queue = unique()
    await create_on(queue, a, b)
    notices: list[str] = []
    async with (
        Client(f"{a.url},{b.url}", on_failover=notices.append) as client,
        client.consumer(queue, name="mover", prefetch=10) as consumer,
    ):
        await client.producer(queue).send_batch(["a1", "a2", "a3"])
        held = [await consumer.receive(timeout=GUARD_S) for _ in range(3)]
        assert all(held)
        first = consumer.consumer_id
        a.kill()
        async with Client(b.url) as other:
            await other.producer(queue).send_batch(["b1", "b2"])
        got = [await consumer.receive(timeout=GUARD_S) for _ in range(2)]
        assert [m.text for m in got if m] == ["b1", "b2"]
        assert client.target == b.url
        assert notices == [f"lost the connection to {a.url}; now connected to {b.url}"]
        [info] = await client.consumers(queue)  # subscribed again as it was
        assert (info.name, info.prefetch) == ("mover", 10)
        assert consumer.consumer_id == info.consumer_id != first
        # Received through the dropped stream: nothing to settle, the node delivers them again.
        m1, m2, m3 = held
        assert m1 is not None and m2 is not None and m3 is not None
        await m1.ack()
        await m2.release()
        with pytest.raises(ConnectionLost, match="received before a failover"):
            await m3.ack(wait=True)
        await consumer.ack_many([m for m in got if m], wait=True)


async def test_a_consumer_whose_channel_the_client_left_subscribes_again_where_it_moved(
    node_factory: Nodes,
) -> None:
    """The consume stream's side of a move: its channel closed under it (CancelledError from
    grpcio) is a dropped stream to resume, not the end of the consumer."""
    a, b = node_factory(), node_factory()
    queue = unique()
    await create_on(queue, a, b)
    async with (
        Client(f"{a.url},{b.url}") as client,
        client.consumer(queue, name="stays") as consumer,
    ):
        await client.producer(queue).send("at a")
        got = await consumer.receive(timeout=GUARD_S)
        assert got is not None and got.text == "at a"
        moving = client._start_move(client.generation)
        assert moving is not None
        await moving
        async with Client(b.url) as other:
            await other.producer(queue).send("at b")
        got = await consumer.receive(timeout=GUARD_S)
        assert got is not None and got.text == "at b" and client.target == b.url


async def test_unacked_messages_come_back_redelivered_when_the_node_returns(
    node_factory: Nodes,
) -> None:
    node = node_factory()
    queue = unique()
    await create_on(queue, node)
    notices: list[str] = []
    async with (
        Client(node.url, failover_timeout=GUARD_S, on_failover=notices.append) as client,
        client.consumer(queue, prefetch=10) as consumer,
    ):
        await client.producer(queue, group_id="g").send_batch([f"m{i}" for i in range(1, 6)])
        held = [await consumer.receive(timeout=GUARD_S) for _ in range(5)]
        assert all(held)
        await consumer.ack_many(held[:2], wait=True)
        node.kill()
        await asyncio.to_thread(node.start)  # same port, same data
        again = [await consumer.receive(timeout=GUARD_S) for _ in range(3)]
        assert [(m.text, m.group_seq, m.redelivered) for m in again if m] == [
            ("m3", 3, True),
            ("m4", 4, True),
            ("m5", 5, True),
        ]
        assert all(m and m.delivery_count == 2 for m in again)
        await consumer.ack_many([m for m in again if m], wait=True)
        await consumer.ack_many([m for m in held[2:] if m])  # stale: ignored
        assert await depth(client, queue) == 0  # nothing more to come
    assert set(notices) == {f"lost the connection to {node.url}; now connected to {node.url}"}


async def test_a_send_cut_short_goes_again_to_the_next_node_as_the_same_messages(
    node_factory: Nodes,
) -> None:
    a, b = node_factory(), node_factory()
    queue, n = unique(), 1000
    await create_on(queue, a, b)
    confirmed: Counter[str] = Counter()  # messages confirmed, by the node that confirmed them
    async with Client(f"{a.url},{b.url}") as client:
        producer = client.producer(queue, group_id="g")

        def sent(count: int) -> None:
            confirmed[client.target] += count
            if client.target == a.url and a.proc is not None and a.proc.poll() is None:
                a.kill()  # with batches in flight behind this one

        ids = await producer.send_many(
            (f"m{i}" for i in range(1, n + 1)), batch_size=5, window=8, on_sent=sent
        )
        assert len(ids) == n and confirmed[a.url] + confirmed[b.url] == n
        at_b = duplicate_ids(await drain(client, queue))
    await asyncio.to_thread(a.start)
    async with Client(a.url, failover_timeout=GUARD_S) as client:  # as b's above
        at_a = duplicate_ids(await drain(client, queue))
    # Every message went out with one duplicate id for good: after the drop, b got exactly
    # those a had not confirmed, numbered as they were (what a took without confirming it is
    # on both nodes, under the same id: the copy a node with duplicate detection drops).
    prefix = at_b[n].rpartition(":")[0]
    assert at_b == {seq: f"{prefix}:{seq}" for seq in range(confirmed[a.url] + 1, n + 1)}
    assert set(at_a) >= set(range(1, confirmed[a.url] + 1))
    assert all(at_a[seq] == f"{prefix}:{seq}" for seq in at_a)
    print(f"a confirmed {confirmed[a.url]}, took {len(at_a) - confirmed[a.url]} more unconfirmed")


async def test_a_send_stream_on_the_channel_the_client_left_goes_on_where_it_moved(
    node_factory: Nodes,
) -> None:
    """A move (another call's failure, here asked for directly) closes the old channel under
    a send stream in flight: grpcio ends that stream with CancelledError, which the send must
    take as an unknown outcome to send again where the client went, not as its own
    cancellation (`pinmq load` died of it when a fenced node's calls moved its client)."""
    a, b = node_factory(), node_factory()
    queue, n = unique(), 5000
    await create_on(queue, a, b)
    async with Client(f"{a.url},{b.url}") as client:
        producer = client.producer(queue, group_id="g")
        moving: list[object] = []

        def sent(count: int) -> None:
            if not moving:
                moving.append(client._start_move(client.generation))

        async with asyncio.timeout(GUARD_S):
            ids = await producer.send_many(
                (f"m{i}" for i in range(1, n + 1)), batch_size=5, window=8, on_sent=sent
            )
        assert len(ids) == n and client.target == b.url
        assert await depth(client, queue) > 0  # b took what a had not confirmed


async def test_a_send_whose_retry_gives_up_says_the_outcome_is_unknown_and_how_to_resend(
    node_factory: Nodes,
) -> None:
    node = node_factory()
    queue = unique()
    await create_on(queue, node)
    async with Client(node.url, failover_timeout=1, connect_timeout=0.5) as client:
        producer = client.producer(queue)
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGSTOP)  # sockets open, nothing answered
        try:
            async with asyncio.timeout(GUARD_S):  # keepalive ends the send within seconds
                with pytest.raises(OutcomeUnknown) as err:
                    await producer.send("into the freeze")
        finally:
            os.kill(node.proc.pid, signal.SIGCONT)
    text = str(err.value)
    assert "the outcome is unknown" in text and "no node to try again" in text
    assert f"may be sent again safely with the same {DUPLICATE_ID_HEADER} headers" in text


def test_cli_consume_moves_to_the_next_node_of_pinmq_url_and_says_so(node_factory: Nodes) -> None:
    a, b = node_factory(), node_factory()
    queue = unique()
    asyncio.run(create_on(queue, a, b))
    env = {**os.environ, "PINMQ_URL": f"{a.url},{b.url}"}
    consume = subprocess.Popen(
        [*PINMQ, "consume", queue, "--count", "2", "--timeout", str(GUARD_S), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        ready = cli("wait", queue, "--consumers", "1", "--url", a.url, "--timeout", str(GUARD_S))
        assert ready.returncode == 0, ready.stderr
        a.kill()
        moved = cli("wait", queue, "--consumers", "1", "--url", b.url, "--timeout", str(GUARD_S))
        assert moved.returncode == 0, moved.stderr
        sent = cli("send", queue, "--count", "2", "--body", "at b", "--url", b.url)
        assert sent.returncode == 0, sent.stderr
        out, err = consume.communicate(timeout=GUARD_S)
    finally:
        consume.kill()
        consume.wait()
    assert consume.returncode == 0, err
    assert len(out.splitlines()) == 2
    assert f"pinmq: lost the connection to {a.url}; now connected to {b.url}" in err


class _Failed(grpc.RpcError):
    """A failed call as grpcio reports it (code, details, trailing metadata)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[()]:
        return ()


def test_a_write_on_a_stream_its_node_ended_is_an_unknown_outcome_to_fail_over_from() -> None:
    """grpcio aio reports a write after the stream ended (its node was killed under a send) as
    INTERNAL "Internal error from Core": a lost link, to retry elsewhere, not a refusal."""
    err = from_rpc(_Failed(grpc.StatusCode.INTERNAL, "Internal error from Core"), "n1:1")
    assert isinstance(err, OutcomeUnknown) and err.code == "UNAVAILABLE"
    other = from_rpc(_Failed(grpc.StatusCode.INTERNAL, "a bug in the node"), "n1:1")
    assert not isinstance(other, OutcomeUnknown) and other.code == "INTERNAL"


async def test_an_auditing_client_names_the_node_it_was_on_for_each_event(
    node_factory: Nodes, tmp_path: Path
) -> None:
    a, b = node_factory(), node_factory()
    queue = unique()
    await create_on(queue, a, b)
    async with Client(f"{a.url},{b.url}", audit=tmp_path / "audit") as client:
        producer = client.producer(queue, group_id="g")
        await producer.send("at a")
        a.kill()
        await producer.send("at b")
        async with client.consumer(queue) as consumer:
            m = await consumer.receive(timeout=5)
            assert m is not None
            await m.ack(wait=True)
    events = [e for path in segments(tmp_path / "audit") for e in read_events(path)]
    assert [(e["kind"], e["node"]) for e in events] == [
        ("client_sent", a.url),
        ("client_sent", b.url),
        ("client_received", b.url),
        ("client_acked", b.url),
    ]
