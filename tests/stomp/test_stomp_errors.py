"""STOMP on a real node: malformed input and limits (an ERROR frame naming them, then the
connection closes), isolation between connections, and the node's lifecycle."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import NodeProcess, unique
from ports import reserve_port
from stomp_helpers import (
    Connect,
    Raw,
    StompNode,
    assert_serving,
    queue_depth,
    stomp_extra,
    subscribe,
)

from broker.client import Client, SyncClient
from pinmq.stomp.frames import encode_frame

# ---- errors --------------------------------------------------------------------------------------


def _connect_frame() -> bytes:
    return encode_frame("CONNECT", {"accept-version": "1.2", "host": "h"})


@pytest.mark.parametrize(
    ("frames", "problem"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "invalid command line"),
        (encode_frame("SEND", {"destination": "q"}, b"x"), "expected a CONNECT or STOMP"),
        (_connect_frame() + b"FROB\n\n\0", "unknown command 'FROB'"),
        (_connect_frame() + _connect_frame(), "already connected"),
        (_connect_frame() + b"SEND\nx:\\t\n\n\0", "invalid escape sequence"),
        (_connect_frame() + b"SEND\ncontent-length:2\n\nabc\0", "longer than its content-length"),
        (_connect_frame() + b"SEND\ncontent-length:2000000\n\n", "max-frame-size"),
        (_connect_frame() + b"SEND\n" + b"h:v\n" * 65 + b"\n\0", "max-headers"),
        (_connect_frame() + b"SEND\nh:" + b"v" * 5000 + b"\n\n\0", "max-header-size"),
        (_connect_frame() + encode_frame("SEND", {}, b"x"), "requires a 'destination' header"),
        (_connect_frame() + encode_frame("SEND", {"destination": "/topic/t"}), "unsupported"),
        (
            _connect_frame() + encode_frame("SEND", {"destination": "/queue/noauto.x"}),
            "forbid auto-creating",
        ),
        (
            _connect_frame() + encode_frame("SUBSCRIBE", {"destination": "/queue/noauto.y"}),
            "requires an 'id' header",
        ),
        (
            _connect_frame()
            + encode_frame("SUBSCRIBE", {"destination": "/queue/noauto.y", "id": "1"}),
            "no queue named 'noauto.y'",
        ),
        (
            _connect_frame()
            + encode_frame("SUBSCRIBE", {"destination": "q", "id": "1", "ack": "sometimes"}),
            "unknown ack mode",
        ),
        (
            _connect_frame()
            + encode_frame("SUBSCRIBE", {"destination": "q", "id": "1", "prefetch-count": "0"}),
            "prefetch-count must be a positive integer",
        ),
        (_connect_frame() + encode_frame("ACK", {"id": "nope"}), "unknown ack id"),
        (_connect_frame() + encode_frame("ACK", {"id": "stomp-0-1/5"}), "not from this conn"),
        (_connect_frame() + encode_frame("COMMIT", {"transaction": "t"}), "no transaction 't'"),
        (_connect_frame() + encode_frame("UNSUBSCRIBE", {"id": "x"}), "no subscription 'x'"),
    ],
)
def test_bad_frames_get_an_error_naming_the_problem_and_close(
    frames: bytes, problem: str, raw: Callable[..., Raw], snode: StompNode
) -> None:
    r = raw()
    r.send(frames)
    got = r.until_closed()
    errors = [f for f in got if f.command == "ERROR"]
    assert len(errors) == 1, got
    assert problem in errors[0].headers["message"]
    assert errors[0].body.decode() == errors[0].headers["message"]
    assert_serving(snode.port)


def test_error_carries_the_receipt_id_of_the_failing_frame(raw: Callable[..., Raw]) -> None:
    r = raw()
    r.connect()
    r.send(encode_frame("SEND", {"destination": "/queue/noauto.z", "receipt": "r-9"}))
    [error] = r.until_closed()
    assert error.headers["receipt-id"] == "r-9"


def test_invalid_heart_beat_header(raw: Callable[..., Raw]) -> None:
    r = raw()
    r.send(encode_frame("CONNECT", {"accept-version": "1.2", "heart-beat": "soon"}))
    [error] = r.until_closed()
    assert "invalid heart-beat header" in error.headers["message"]


def test_oversized_streamed_frame_is_refused(raw: Callable[..., Raw], snode: StompNode) -> None:
    r = raw()
    r.connect()
    r.send(b"SEND\ndestination:/queue/big\n\n")
    chunk = b"x" * 65536
    try:
        for _ in range(40):  # 2.5 MiB > max-frame-size, no content-length
            r.send(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the node may close before everything is sent
    frames = r.until_closed()
    assert frames and "max-frame-size" in frames[-1].headers["message"]
    assert_serving(snode.port)


def test_disconnect_mid_frame_applies_nothing(
    raw: Callable[..., Raw], connect: Connect, admin: SyncClient
) -> None:
    q = unique()
    r = raw()
    r.connect()
    r.send(encode_frame("SEND", {"destination": f"/queue/{q}", "receipt": "whole"}, b"whole"))
    assert r.frame().headers["receipt-id"] == "whole"
    # A transaction with a complete SEND, then a SEND cut off in its body.
    r.send(encode_frame("BEGIN", {"transaction": "t"}))
    r.send(encode_frame("SEND", {"destination": f"/queue/{q}", "transaction": "t"}, b"tx"))
    r.send(b"SEND\ndestination:/queue/" + q.encode() + b"\ncontent-length:100\n\n" + b"x" * 50)
    r.close()
    # A client that dies in the middle of the headers.
    r2 = raw()
    r2.connect()
    r2.send(b"SEND\ndestination:/queue/" + q.encode() + b"\npersis")
    r2.close()
    conn, rec = connect()
    subscribe(conn, rec, q, "s", ack="client-individual")
    [m] = rec.wait_messages(1)
    assert m.body == "whole"
    assert queue_depth(admin, q) == 1


# ---- isolation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["client-individual", "auto"])
def test_slow_consumer_blocks_neither_producers_nor_other_consumers(
    mode: str, raw: Callable[..., Raw], connect: Connect
) -> None:
    q = unique()
    n, size, prefetch = 200, 64 * 1024, 5
    slow = raw(rcvbuf=4096)
    slow.connect()
    slow.send(
        encode_frame(
            "SUBSCRIBE",
            {
                "destination": f"/queue/{q}",
                "id": "slow",
                "ack": mode,
                "prefetch-count": str(prefetch),
                "receipt": "subscribed",
            },
        )
    )
    assert slow.frame().headers["receipt-id"] == "subscribed"  # from now on it reads nothing
    holder: dict[str, Any] = {}
    fast, frec = connect(on_message=lambda f: holder["conn"].ack(f.headers["ack"]))
    holder["conn"] = fast
    subscribe(fast, frec, q, "fast", ack="client-individual", **{"prefetch-count": "20"})
    producer, prec = connect()
    body = "x" * size
    for i in range(n):
        producer.send(f"/queue/{q}", body, headers={"receipt": f"p{i}"})
    prec.wait_receipt(f"p{n - 1}")
    # The slow consumer holds at most its prefetch (client-individual) or what its socket
    # buffers absorbed (auto); everything else reaches the fast one.
    expected = n - prefetch if mode == "client-individual" else n - 100
    frec.wait(lambda: len(frec.messages) >= expected, f"{expected} messages at the fast consumer")


def test_queue_deleted_under_a_subscription_ends_it_with_an_error(
    raw: Callable[..., Raw], snode: StompNode
) -> None:
    q = unique()
    r = raw()
    r.connect()
    r.send(encode_frame("SUBSCRIBE", {"destination": q, "id": "s", "receipt": "sub"}))
    assert r.frame().headers["receipt-id"] == "sub"

    async def delete() -> None:
        async with Client(snode.node.url) as client:
            await client.delete_queue(q)

    asyncio.run(delete())
    [error] = r.until_closed()
    assert error.headers["subscription"] == "s"
    assert "was deleted" in error.headers["message"]


# ---- node lifecycle ------------------------------------------------------------------------------


def test_node_shutdown_tells_stomp_clients(
    node_factory: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    port = reserve_port()
    node = node_factory(stomp_extra(port))
    consumer, producer = Raw(port), Raw(port)
    try:
        consumer.connect()
        consumer.send(encode_frame("SUBSCRIBE", {"destination": "q", "id": "s", "receipt": "r"}))
        assert consumer.frame().headers["receipt-id"] == "r"
        producer.connect()
        assert node.stop() == 0
        for r in (consumer, producer):
            [error] = r.until_closed()
            assert error.headers["message"] == "the node is shutting down"
    finally:
        consumer.close()
        producer.close()


def test_stomp_port_in_use_is_a_clear_startup_error(
    node_factory: Callable[..., NodeProcess],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        node = node_factory(stomp_extra(port), start=False)
        node.start(wait=False)
        assert node.wait_exit() == 1
    assert f"cannot listen on 127.0.0.1:{port} for STOMP" in node.log()
