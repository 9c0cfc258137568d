"""A client with several addresses whose call passed its deadline: a frozen node is left as a
lost one is, a slow one is not.

A frozen node (SIGSTOP: sockets open, nothing answered) also stops answering the keepalive
pings that gRPC's own threads answer in a live process, however busy its event loop. The first
two tests freeze real node processes (standalone ones stand in for a node and its backup, as
in test_client_failover.py); the last needs a node that is alive but never answers the call,
which no real node does on purpose: two scripted Broker servers in this process stand in.
No test asserts on timing: every wait is a bounded guard.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from conftest import NodeProcess, create_on, drain, unique
from grpc import aio

from broker import channels
from broker.client import Client, OutcomeUnknown
from pinmq_pb import client_pb2_grpc as pb_grpc

GUARD_S = 60.0

Nodes = Callable[..., NodeProcess]


async def test_a_send_past_its_deadline_on_a_frozen_node_goes_again_to_the_next_node(
    node_factory: Nodes,
) -> None:
    a, b = node_factory(), node_factory()
    queue = unique()
    await create_on(queue, a, b)
    notices: list[str] = []
    # A deadline shorter than keepalive's two intervals: the call ends before the transport.
    async with Client(f"{a.url},{b.url}", call_timeout=1.0, on_failover=notices.append) as client:
        producer = client.producer(queue, group_id="g")
        await producer.send("before")
        with a.frozen():
            async with asyncio.timeout(GUARD_S):
                await producer.send("into the freeze")
            assert client.target == b.url
        assert notices == [f"lost the connection to {a.url}; now connected to {b.url}"]
        assert [m.body for m in await drain(client, queue)] == [b"into the freeze"]


async def test_a_change_past_its_deadline_on_a_frozen_node_is_unknown_and_the_client_moves(
    node_factory: Nodes,
) -> None:
    """A change is never made twice by the client itself: its outcome is unknown, as after an
    outage, and the calls after it go to the next node."""
    a, b = node_factory(), node_factory()
    queue = unique()
    async with Client(f"{a.url},{b.url}", call_timeout=1.0) as client:
        with a.frozen():
            async with asyncio.timeout(GUARD_S):
                with pytest.raises(OutcomeUnknown, match="stopped answering its keepalive") as err:
                    await client.create_queue(queue)
                assert err.value.code == "UNAVAILABLE"
                assert queue not in [q.name for q in await client.queues()]  # asked at b
            assert client.target == b.url


class _Unanswering(pb_grpc.BrokerServicer):
    """A live node that takes sends and never answers them."""

    def __init__(self) -> None:
        self.calls = 0

    async def SendStream(self, request_iterator, context):  # type: ignore[no-untyped-def]
        self.calls += 1
        await asyncio.sleep(GUARD_S)
        yield  # never reached: makes this an async generator, as a stream handler is


@asynccontextmanager
async def _servers(count: int) -> AsyncIterator[list[tuple[str, _Unanswering]]]:
    """`count` in-process Broker servers that never answer, with their addresses."""
    started: list[tuple[aio.Server, str, _Unanswering]] = []
    try:
        for _ in range(count):
            # A node's keepalive policy: grpc's default takes the client's pings for abuse
            # and ends the connection (GOAWAY), which looks like the node leaving.
            server, servicer = aio.server(options=channels.serve_keepalive()), _Unanswering()
            pb_grpc.add_BrokerServicer_to_server(servicer, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            started.append((server, f"127.0.0.1:{port}", servicer))
        yield [(address, servicer) for _, address, servicer in started]
    finally:
        for server, _, _ in started:
            await server.stop(grace=None)


async def test_a_node_that_answers_its_pings_but_not_the_call_keeps_the_client() -> None:
    async with _servers(2) as [(slow, first), (other, second)]:
        client = Client(f"{slow},{other}", call_timeout=0.5)
        async with client, asyncio.timeout(GUARD_S):
            with pytest.raises(OutcomeUnknown, match="the outcome is unknown") as err:
                await client.producer(unique()).send("never answered")
            assert err.value.code == "DEADLINE_EXCEEDED"
            assert client.target == slow
        assert (first.calls, second.calls) == (1, 0)
