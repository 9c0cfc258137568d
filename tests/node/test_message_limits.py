"""The edges of a message on a real node: what max-message-size counts (the same on gRPC and
STOMP), large messages reach the Python client, undecodable requests and exhausted memory get
their own status codes, the STOMP listen backlog, and dead-letter addresses that would drop.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import NodeProcess, unique
from grpc import aio
from stomp_helpers import Raw

from broker.client import Client, InvalidArgument
from broker.config_file import ConfigError, load_config
from broker.message import DUPLICATE_ID_HEADER
from pinmq.grpc_status import abort
from pinmq.stomp.frames import encode_frame

LIMIT = 64 * 1024


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    limits = {"max-message-size": LIMIT, "max-batch-messages": 10}
    extra = {"limits": limits, "stomp": {"listen-backlog": 777}}
    node = NodeProcess(tmp_path, extra).start()
    yield node
    node.kill()


async def test_max_message_size_counts_body_and_headers_on_grpc_and_stomp(
    node: NodeProcess,
) -> None:
    queue = unique("size")
    headers = {"h": "x" * 99}  # 100 characters of header
    # The client adds a duplicate id to every message unless it has one: ours fills 100 too.
    own_id = DUPLICATE_ID_HEADER
    async with Client(node.url) as client:
        await client.create_queue(queue)
        producer = client.producer(queue)
        at_limit = {own_id: "1".ljust(100 - len(own_id), "x")}
        await producer.send(b"b" * (LIMIT - 100), at_limit)  # exactly the limit
        with pytest.raises(InvalidArgument, match=r"message of 65537 bytes \(body and headers\)"):
            await producer.send(b"b" * (LIMIT - 99), {own_id: "2".ljust(100 - len(own_id), "x")})
        stomp_port = node.stomp_port
        with Raw(stomp_port) as r:
            r.connect()
            frame = {"destination": f"/queue/{queue}", "receipt": "r", **headers}
            r.send(encode_frame("SEND", frame, b"b" * (LIMIT - 100), version="1.2"))
            assert r.frame().command == "RECEIPT"
            r.send(encode_frame("SEND", frame, b"b" * (LIMIT - 99), version="1.2"))
            error = r.frame()
            assert error.command == "ERROR"
            assert "message of 65537 bytes (body and headers)" in error.headers["message"]
        [info] = [q for q in await client.queues() if q.name == queue]
        assert info.depth == 2


async def test_a_batch_or_transaction_over_max_batch_messages_is_refused_whole(
    node: NodeProcess,
) -> None:
    queue = unique("batch")
    async with Client(node.url) as client:
        await client.create_queue(queue)
        producer = client.producer(queue)
        await producer.send_batch([b"m"] * 10)
        with pytest.raises(InvalidArgument, match=r"a batch of 11 messages: more than limits"):
            await producer.send_batch([b"m"] * 11)
        with Raw(node.stomp_port) as r:
            r.connect()
            frames = [encode_frame("BEGIN", {"transaction": "t"}, b"", version="1.2")]
            for _ in range(11):
                send = {"destination": f"/queue/{queue}", "transaction": "t"}
                frames.append(encode_frame("SEND", send, b"m", version="1.2"))
            r.send(b"".join(frames))
            error = r.frame()
            assert error.command == "ERROR"
            assert (
                "holds 10 frames, the limit (limits.max-batch-messages)" in error.headers["message"]
            )
        [info] = [q for q in await client.queues() if q.name == queue]
        assert info.depth == 10


async def test_a_message_over_4_mib_reaches_the_python_client(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path).start()  # default max-message-size: 10 MiB
    try:
        queue = unique("big")
        body = bytes(range(256)) * (6 * 4096)  # 6 MiB: over gRPC's default receive limit
        async with Client(node.url) as client:
            await client.create_queue(queue)
            await client.producer(queue).send(body)
            async with client.consumer(queue) as consumer:
                m = await consumer.receive(timeout=10)
                assert m is not None and m.body == body
                await m.ack(wait=True)
    finally:
        node.kill()


async def test_a_request_that_does_not_decode_is_invalid_argument_not_unknown(
    node: NodeProcess,
) -> None:
    async with aio.insecure_channel(node.url) as channel:
        bad_utf8 = {  # a string field holding bytes that are not UTF-8
            "/pinmq.client.v1.Broker/Send": b"\x0a\x03\x0a\x01\xff",  # message.address
            "/pinmq.client.v1.Admin/ListGroups": b"\x0a\x01\xff",  # queue
        }
        for method, payload in bad_utf8.items():
            call = channel.unary_unary(method, request_serializer=lambda x: x)
            with pytest.raises(aio.AioRpcError) as err:
                await call(payload, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
            assert "could not be decoded" in (err.value.details() or "")
        consume = channel.stream_stream(
            "/pinmq.client.v1.Broker/Consume", request_serializer=lambda x: x
        )
        stream = consume(iter([b"\xff\xff\xff"]), timeout=5)
        with pytest.raises(aio.AioRpcError) as err:
            async for _ in stream:
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    async with Client(node.url) as client:  # and the node serves on
        assert isinstance(await client.queues(), list)


class _Context:
    """Records how `abort` ends a call."""

    def __init__(self) -> None:
        self.ended: tuple[Any, str] | None = None

    async def abort(self, code: Any, details: str, trailing_metadata: Any = ()) -> None:
        self.ended = (code, details)
        raise asyncio.CancelledError


async def test_out_of_memory_is_resource_exhausted() -> None:
    context = _Context()
    with pytest.raises(asyncio.CancelledError):
        await abort(context, MemoryError())  # type: ignore[arg-type]
    assert context.ended == (grpc.StatusCode.RESOURCE_EXHAUSTED, "the node is out of memory")


def test_the_stomp_listen_backlog_is_configurable(node: NodeProcess) -> None:
    port = node.stomp_port
    listing = subprocess.run(
        ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert listing[2] == "777", listing  # Send-Q of a listening socket: its backlog


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text("node: {id: n1}\n" + text)
    return path


def test_a_dead_letter_address_that_is_the_queues_own_address_is_refused(
    tmp_path: Path,
) -> None:
    declared = "addresses:\n  orders:\n    queues:\n      orders: {dead-letter-address: orders}\n"
    with pytest.raises(ConfigError, match="dead-letter-address is the queue's own address"):
        load_config(_config(tmp_path, declared))
    settings = "address-settings:\n  orders: {dead-letter-address: orders}\n"
    with pytest.raises(ConfigError, match="dead-letter-address is the address itself"):
        load_config(_config(tmp_path, settings))


async def test_a_message_rejected_on_its_dead_letter_address_is_dropped_with_a_log_line(
    node: NodeProcess,
) -> None:
    queue = unique("dl")
    async with Client(node.url) as client:
        await client.create_queue(queue)
        await client.producer(queue).send(b"poison")
        for where in (queue, "DLQ"):  # rejected, then rejected again on DLQ (its own DLA)
            async with client.consumer(where) as consumer:
                m = await consumer.receive(timeout=5)
                assert m is not None and m.body == b"poison"
                await m.reject(wait=True)
        depths = {q.name: q.depth for q in await client.queues()}
        assert depths[queue] == 0 and depths["DLQ"] == 0
    lines = [json.loads(x) for x in node.log_path.read_text().splitlines() if x.startswith("{")]
    [dropped] = [e for e in lines if e.get("event") == "dead message dropped"]
    assert dropped["queue"] == "DLQ" and "own dead-letter address" in dropped["reason"]
