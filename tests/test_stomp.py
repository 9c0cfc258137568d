"""STOMP on a real node: stomp.py for every frame, ack mode and group scenario; raw sockets for
malformed input, limits, heart-beats, disconnects mid-frame and slow consumers."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import stomp
from conftest import NodeProcess, unique
from ports import reserve_port

from broker.client import Client, SyncClient
from pinmq.stomp.frames import Frame, FrameParser, encode_frame

WAIT_S = 15.0
NODE_STOMP = {
    "max-frame-size": 1 << 20,
    "max-headers": 64,
    "max-header-size": 4096,
    "heart-beat-ms": 100,
    "connect-timeout-ms": 2000,
}
NO_AUTO_CREATE = {"noauto.#": {"auto-create-queues": False, "auto-create-addresses": False}}


@dataclass
class StompNode:
    node: NodeProcess
    port: int


def stomp_extra(port: int, **more: Any) -> dict[str, Any]:
    return {"listen": {"stomp": f"127.0.0.1:{port}"}, **more}


@pytest.fixture(scope="module")
def snode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StompNode]:
    port = reserve_port()
    extra = stomp_extra(port, stomp=NODE_STOMP, **{"address-settings": NO_AUTO_CREATE})
    node = NodeProcess(tmp_path_factory.mktemp("stomp-node"), extra).start()
    yield StompNode(node, port)
    node.kill()


@pytest.fixture(scope="module")
def admin(snode: StompNode) -> Iterator[SyncClient]:
    with SyncClient(snode.node.url) as client:
        yield client


# ---- stomp.py helpers ----------------------------------------------------------------------------


class Recorder(stomp.ConnectionListener):
    """Everything a stomp.py connection received, with bounded waits on it."""

    def __init__(self, on_message: Callable[[Any], None] | None = None) -> None:
        self.cond = threading.Condition()
        self.messages: list[Any] = []
        self.receipts: list[str] = []
        self.errors: list[Any] = []
        self.connected: dict[str, str] = {}
        self.heartbeats = 0
        self.disconnected = False
        self._on_message = on_message

    def _event(self, update: Callable[[], None]) -> None:
        with self.cond:
            update()
            self.cond.notify_all()

    def on_connected(self, frame: Any) -> None:
        self._event(lambda: self.connected.update(frame.headers))

    def on_message(self, frame: Any) -> None:
        if self._on_message is not None:
            self._on_message(frame)
        self._event(lambda: self.messages.append(frame))

    def on_receipt(self, frame: Any) -> None:
        self._event(lambda: self.receipts.append(frame.headers["receipt-id"]))

    def on_error(self, frame: Any) -> None:
        self._event(lambda: self.errors.append(frame))

    def on_heartbeat(self) -> None:
        def bump() -> None:
            self.heartbeats += 1

        self._event(bump)

    def on_disconnected(self) -> None:
        self._event(lambda: setattr(self, "disconnected", True))

    def wait(self, predicate: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
        with self.cond:
            assert self.cond.wait_for(predicate, timeout), f"timed out waiting for {what}"

    def wait_messages(self, n: int) -> list[Any]:
        self.wait(lambda: len(self.messages) >= n, f"{n} messages (got {len(self.messages)})")
        return list(self.messages)

    def wait_receipt(self, receipt: str) -> None:
        self.wait(lambda: receipt in self.receipts, f"receipt {receipt}")


Connect = Callable[..., tuple[Any, Recorder]]


@pytest.fixture
def connect(snode: StompNode) -> Iterator[Connect]:
    """Open stomp.py connections (TCP_NODELAY set); all are closed at the end of the test."""
    opened: list[Any] = []

    def make(
        version: str = "1.2",
        *,
        port: int | None = None,
        heartbeats: tuple[int, int] = (0, 0),
        on_message: Callable[[Any], None] | None = None,
        auto_decode: bool = True,
        headers: dict[str, str] | None = None,
    ) -> tuple[Any, Recorder]:
        hosts = [("127.0.0.1", port or snode.port)]
        if version == "1.0":
            conn = stomp.Connection10(hosts, auto_decode=auto_decode)
        else:
            cls = stomp.Connection11 if version == "1.1" else stomp.Connection12
            conn = cls(hosts, heartbeats=heartbeats, auto_decode=auto_decode)
        rec = Recorder(on_message)
        conn.set_listener("rec", rec)
        conn.connect(wait=True, headers=headers or {})
        rec.wait(lambda: bool(rec.connected), "CONNECTED at the listener")
        conn.transport.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        opened.append(conn)
        return conn, rec

    yield make
    for conn in opened:
        try:
            if conn.is_connected():
                conn.disconnect()
        except Exception:
            pass


def subscribe(conn: Any, rec: Recorder, queue: str, sub_id: str, **headers: str) -> None:
    """SUBSCRIBE and wait for its receipt, so the consumer exists before anything is sent."""
    receipt = unique("sub")
    ack = headers.pop("ack", "client-individual")
    conn.subscribe(f"/queue/{queue}", id=sub_id, ack=ack, headers={**headers, "receipt": receipt})
    rec.wait_receipt(receipt)


def send_group(
    conn: Any, rec: Recorder, queue: str, group: str, seqs: list[int], **headers: str
) -> None:
    """Persistent sends with JMSXGroupID/JMSXGroupSeq; waits for the receipt of the last."""
    receipt = unique("send")
    for i, seq in enumerate(seqs):
        extra = {"receipt": receipt} if i == len(seqs) - 1 else {}
        conn.send(
            f"/queue/{queue}",
            f"{group}-{seq}",
            headers={
                "JMSXGroupID": group,
                "JMSXGroupSeq": str(seq),
                "persistent": "true",
                **headers,
                **extra,
            },
        )
    rec.wait_receipt(receipt)


def queue_depth(admin: SyncClient, queue: str) -> int | None:
    return next((q.depth for q in admin.queues() if q.name == queue), None)


def wait_until(check: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def seqs(messages: list[Any]) -> list[int]:
    return [int(m.headers["JMSXGroupSeq"]) for m in messages]


# ---- raw socket helper ---------------------------------------------------------------------------


class Raw:
    """A bare TCP client speaking STOMP bytes; frames from the node are parsed with our parser."""

    def __init__(self, port: int, *, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket()
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(WAIT_S)
        self.sock.connect(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = FrameParser(escaping=True)
        self.eof = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frame(self) -> Frame:
        """The next frame from the node (heart-beats skipped); fails on EOF or timeout."""
        while (f := self.parser.next()) is None:
            data = self.sock.recv(65536)
            assert data, "connection closed while waiting for a frame"
            self.parser.feed(data)
        return f

    def connect(self, version: str = "1.2", **headers: str) -> Frame:
        self.send(
            encode_frame("CONNECT", {"accept-version": version, "host": "localhost", **headers})
        )
        connected = self.frame()
        assert connected.command == "CONNECTED", connected
        return connected

    def until_closed(self) -> list[Frame]:
        """Read until the node closes the connection; returns the frames that came first."""
        frames: list[Frame] = []
        while True:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                return frames
            self.parser.feed(data)
            while (f := self.parser.next()) is not None:
                frames.append(f)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(snode: StompNode) -> Iterator[Callable[..., Raw]]:
    opened: list[Raw] = []

    def make(**kwargs: Any) -> Raw:
        r = Raw(kwargs.pop("port", snode.port), **kwargs)
        opened.append(r)
        return r

    yield make
    for r in opened:
        r.close()


def assert_serving(port: int) -> None:
    """A fresh connection still gets CONNECTED: the node survived whatever came before."""
    r = Raw(port)
    try:
        r.connect()
    finally:
        r.close()


# ---- connecting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_each_version_sends_subscribes_acks_and_disconnects(
    version: str, connect: Connect, admin: SyncClient
) -> None:
    q = unique()
    conn, rec = connect(version)
    assert rec.connected["version"] == version
    assert ("heart-beat" in rec.connected) == (version != "1.0")
    value = "plain" if version == "1.0" else "a:b\\c\nd"
    for i in range(3):
        conn.send(f"/queue/{q}", f"m{i}", headers={"x-custom": value, "persistent": "true"})
    if version == "1.0":
        conn.subscribe(f"/queue/{q}", ack="client")  # 1.0: the id defaults to the destination
    else:
        conn.subscribe(f"/queue/{q}", id="s1", ack="client")
    got = rec.wait_messages(3)
    assert [m.body for m in got] == ["m0", "m1", "m2"]
    for m in got:
        assert m.headers["x-custom"] == value
        assert m.headers["destination"] == f"/queue/{q}"
        assert m.headers["persistent"] == "true"
        assert ("ack" in m.headers) == (version == "1.2")
    last = got[-1]
    receipt = unique("ack")
    if version == "1.0":
        conn.ack(last.headers["message-id"], receipt=receipt)
    elif version == "1.1":
        conn.ack(last.headers["message-id"], last.headers["subscription"], receipt=receipt)
    else:
        conn.ack(last.headers["ack"], receipt=receipt)
    rec.wait_receipt(receipt)  # client mode: cumulative, all three are acknowledged
    assert queue_depth(admin, q) == 0
    receipt = unique("unsub")
    if version == "1.0":
        conn.unsubscribe(destination=f"/queue/{q}", headers={"receipt": receipt})
    else:
        conn.unsubscribe(id="s1", headers={"receipt": receipt})
    rec.wait_receipt(receipt)
    conn.disconnect(receipt="bye")
    rec.wait_receipt("bye")
    assert not rec.errors


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_nack_in_each_version(version: str, connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect(version)
    send_group(conn, rec, q, "g", [1, 2])
    conn.subscribe(f"/queue/{q}", id="s", ack="client-individual")
    m1, _ = rec.wait_messages(2)
    if version == "1.1":
        conn.nack(m1.headers["message-id"], "s")
    else:
        conn.nack(m1.headers["ack"])
    again = rec.wait_messages(4)[2:]
    assert seqs(again) == [1, 2]
    assert again[0].headers["message-id"] == m1.headers["message-id"]
    for m in again:
        if version == "1.1":
            conn.ack(m.headers["message-id"], "s")
        else:
            conn.ack(m.headers["ack"])
    wait_until(lambda: queue_depth(admin, q) == 0, "acks of the redelivered messages")


def test_stomp_10_unsubscribes_by_destination(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect("1.0")
    send_group(conn, rec, q, "g", [1])
    conn.subscribe(f"/queue/{q}", id="explicit", ack="client")
    rec.wait_messages(1)
    conn.unsubscribe(destination=f"/queue/{q}", headers={"receipt": "gone"})
    rec.wait_receipt("gone")
    assert [(x.depth, x.consumer_count) for x in admin.queues() if x.name == q] == [(1, 0)]


def test_version_negotiation_refuses_unknown_versions(raw: Callable[..., Raw]) -> None:
    r = raw()
    r.send(encode_frame("CONNECT", {"accept-version": "2.0,3.1", "host": "h"}))
    [error] = r.until_closed()
    assert error.command == "ERROR"
    assert error.headers["version"] == "1.0,1.1,1.2"
    assert "supported protocol versions" in error.headers["message"]


def test_stomp_frame_picks_the_highest_common_version(raw: Callable[..., Raw]) -> None:
    r = raw()
    r.send(encode_frame("STOMP", {"accept-version": "1.0,1.1", "host": "vhost"}))
    connected = r.frame()
    assert connected.command == "CONNECTED"
    assert connected.headers["version"] == "1.1"
    assert connected.headers["server"].startswith("pinmq/")
    assert connected.headers["session"]


def test_connect_without_accept_version_is_stomp_10(raw: Callable[..., Raw]) -> None:
    r = raw()
    r.send(b"CONNECT\nlogin:guest\npasscode:guest\n\n\0")
    connected = r.frame()
    assert connected.headers["version"] == "1.0"
    assert "heart-beat" not in connected.headers


def test_no_connect_frame_in_time_closes_the_connection(raw: Callable[..., Raw]) -> None:
    [error] = raw().until_closed()
    assert "no CONNECT frame within 2000 ms" in error.headers["message"]


# ---- messages ------------------------------------------------------------------------------------


def test_message_frame_headers(connect: Connect) -> None:
    q = unique()
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2], **{"content-type": "text/plain", "x-y": "z"})
    conn.send(f"/queue/{q}", "ungrouped", headers={"receipt": "r-ungrouped"})
    rec.wait_receipt("r-ungrouped")
    conn.send(f"/queue/{q}", "no seq", headers={"_AMQ_GROUP_ID": "h", "receipt": "r-noseq"})
    rec.wait_receipt("r-noseq")
    subscribe(conn, rec, q, "s1", ack="client-individual")
    m1, m2, m3, m4 = rec.wait_messages(4)
    assert m4.headers["JMSXGroupID"] == "h"  # the group key, whichever header named it
    assert "JMSXGroupSeq" not in m4.headers  # the sender set no sequence: none is made up
    assert m1.headers["subscription"] == "s1"
    assert m1.headers["destination"] == f"/queue/{q}"
    assert m1.headers["JMSXGroupID"] == "g"
    assert [m1.headers["JMSXGroupSeq"], m2.headers["JMSXGroupSeq"]] == ["1", "2"]
    assert m1.headers["content-type"] == "text/plain"
    assert m1.headers["x-y"] == "z"
    assert m1.headers["persistent"] == "true"
    assert "redelivered" not in m1.headers
    assert "JMSXGroupID" not in m3.headers
    assert "persistent" not in m3.headers
    ids = [m.headers["message-id"] for m in (m1, m2, m3)]
    acks = [m.headers["ack"] for m in (m1, m2, m3)]
    assert len(set(ids)) == 3
    assert len(set(acks)) == 3


def test_binary_bodies_with_nul_bytes(connect: Connect) -> None:
    q = unique()
    conn, rec = connect(auto_decode=False)
    body = bytes(range(256)) + b"\0\0end"
    conn.send(f"/queue/{q}", body, headers={"receipt": "r"})
    rec.wait_receipt("r")
    subscribe(conn, rec, q, "s", ack="auto")
    [m] = rec.wait_messages(1)
    assert m.body == body


def test_large_messages_in_order(connect: Connect) -> None:
    q = unique()
    conn, rec = connect(auto_decode=False)
    bodies = [bytes([i]) * (900 * 1024) for i in range(5)]  # written in slices, not all at once
    for i, body in enumerate(bodies):
        conn.send(f"/queue/{q}", body, headers={"JMSXGroupID": "g", "receipt": f"r{i}"})
    rec.wait_receipt("r4")
    subscribe(conn, rec, q, "s", ack="auto")
    assert [m.body for m in rec.wait_messages(5)] == bodies


def test_bare_destination_names_the_same_queue(connect: Connect) -> None:
    q = unique()
    conn, rec = connect()
    conn.send(q, "bare", headers={"receipt": "r"})
    rec.wait_receipt("r")
    subscribe(conn, rec, q, "s", ack="auto")
    [m] = rec.wait_messages(1)
    assert m.body == "bare"


def test_persistent_send_receipt_means_on_disk(
    node_factory: Callable[..., NodeProcess], connect: Connect
) -> None:
    port = reserve_port()
    node = node_factory(stomp_extra(port))
    q = unique()
    conn, rec = connect(port=port)
    send_group(conn, rec, q, "g", [1, 2, 3])
    node.kill()  # kill -9 right after the receipt
    node.start()
    with SyncClient(node.url) as client:
        got = client.consume(q, 3)
    assert [(m.group_id, m.group_seq, m.body) for m in got] == [
        ("g", i, f"g-{i}".encode()) for i in (1, 2, 3)
    ]


def test_receipts_for_every_frame_type_in_order(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect()
    conn.send(f"/queue/{q}", "a", headers={"receipt": "r1", "persistent": "true"})
    conn.subscribe(f"/queue/{q}", id="s", ack="client-individual", headers={"receipt": "r2"})
    [m] = rec.wait_messages(1)
    conn.begin("tx", headers={"receipt": "r3"})
    conn.send(f"/queue/{q}", "b", headers={"transaction": "tx", "receipt": "r4"})
    conn.commit("tx", headers={"receipt": "r5"})
    conn.begin("tx2", headers={"receipt": "r6"})
    conn.abort("tx2", headers={"receipt": "r7"})
    conn.ack(m.headers["ack"], receipt="r8")
    [_, m2] = rec.wait_messages(2)
    conn.nack(m2.headers["ack"], receipt="r9")
    conn.unsubscribe(id="s", headers={"receipt": "r10"})
    conn.disconnect(receipt="r11")
    rec.wait_receipt("r11")
    assert rec.receipts == [f"r{i}" for i in range(1, 12)]
    assert queue_depth(admin, q) == 1  # "b" was released, then returned by the unsubscribe


# ---- ack modes and prefetch ----------------------------------------------------------------------


def test_auto_ack_consumes_without_ack_frames(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2, 3, 4])
    subscribe(conn, rec, q, "s", ack="auto")
    assert seqs(rec.wait_messages(4)) == [1, 2, 3, 4]
    wait_until(lambda: queue_depth(admin, q) == 0, "auto acks")


def test_client_ack_is_cumulative(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2, 3, 4, 5])
    subscribe(conn, rec, q, "s", ack="client")
    got = rec.wait_messages(5)
    conn.ack(got[2].headers["ack"], receipt="r")  # acknowledges 1, 2 and 3
    rec.wait_receipt("r")
    assert queue_depth(admin, q) == 2
    conn.disconnect(receipt="bye")
    rec.wait_receipt("bye")
    conn2, rec2 = connect()
    subscribe(conn2, rec2, q, "s", ack="client")
    again = rec2.wait_messages(2)
    assert seqs(again) == [4, 5]
    assert all(m.headers["redelivered"] == "true" for m in again)


def test_client_individual_acks_only_the_named_message(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2, 3, 4, 5])
    subscribe(conn, rec, q, "s", ack="client-individual")
    got = rec.wait_messages(5)
    conn.ack(got[1].headers["ack"])
    conn.ack(got[3].headers["ack"], receipt="r")
    rec.wait_receipt("r")
    assert queue_depth(admin, q) == 3
    conn.disconnect(receipt="bye")
    rec.wait_receipt("bye")
    conn2, rec2 = connect()
    subscribe(conn2, rec2, q, "s", ack="client-individual")
    again = rec2.wait_messages(3)
    assert seqs(again) == [1, 3, 5]
    assert [m.headers["JMSXDeliveryCount"] for m in again] == ["2", "2", "2"]


@pytest.mark.parametrize("header", ["activemq.prefetchSize", "prefetch-count"])
def test_prefetch_bounds_unacknowledged_messages(
    header: str, connect: Connect, admin: SyncClient
) -> None:
    q = unique()
    conn, rec = connect()
    send_group(conn, rec, q, "g", list(range(1, 11)))
    subscribe(conn, rec, q, "s", ack="client-individual", **{header: "3"})
    got = rec.wait_messages(3)
    [group] = admin.groups(q)
    assert (group.outstanding, group.pending) == (3, 7)
    conn.ack(got[0].headers["ack"])
    rec.wait_messages(4)
    [group] = admin.groups(q)
    assert (group.outstanding, group.pending) == (3, 6)


# ---- transactions --------------------------------------------------------------------------------


def test_transactional_sends_apply_on_commit_only(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect()
    conn.begin("t1")
    for i in range(3):
        conn.send(f"/queue/{q}", f"m{i}", headers={"transaction": "t1", "persistent": "true"})
    conn.begin("t2")
    conn.send(f"/queue/{q}", "never", headers={"transaction": "t2"})
    conn.abort("t2", headers={"receipt": "aborted"})
    rec.wait_receipt("aborted")
    assert not queue_depth(admin, q)
    conn.commit("t1", headers={"receipt": "committed"})
    rec.wait_receipt("committed")
    assert queue_depth(admin, q) == 3


def test_transactional_acks_apply_on_commit_only(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2, 3])
    subscribe(conn, rec, q, "s", ack="client-individual")
    m1, m2, _ = rec.wait_messages(3)
    conn.begin("t1")
    conn.ack(m1.headers["ack"], transaction="t1")
    conn.ack(m2.headers["ack"], transaction="t1")
    conn.abort("t1", headers={"receipt": "aborted"})
    rec.wait_receipt("aborted")
    assert queue_depth(admin, q) == 3
    conn.begin("t2")
    conn.ack(m1.headers["ack"], transaction="t2")
    conn.commit("t2", headers={"receipt": "committed"})
    rec.wait_receipt("committed")
    assert queue_depth(admin, q) == 2


def test_uncommitted_transaction_is_discarded_on_disconnect(
    connect: Connect, admin: SyncClient
) -> None:
    q = unique()
    conn, rec = connect()
    conn.send(f"/queue/{q}", "kept", headers={"receipt": "r"})
    rec.wait_receipt("r")
    conn.begin("t")
    conn.send(f"/queue/{q}", "dropped", headers={"transaction": "t"})
    conn.disconnect(receipt="bye")
    rec.wait_receipt("bye")
    assert queue_depth(admin, q) == 1


# ---- NACK ----------------------------------------------------------------------------------------


def test_nack_releases_to_the_group_head_in_order(connect: Connect) -> None:
    q = unique()
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2, 3])
    subscribe(conn, rec, q, "s", ack="client-individual")
    m1, m2, _ = rec.wait_messages(3)
    conn.ack(m1.headers["ack"])
    conn.nack(m2.headers["ack"])  # 2 and the later 3 come back, in order
    again = rec.wait_messages(5)[3:]
    assert seqs(again) == [2, 3]
    assert [m.headers["redelivered"] for m in again] == ["true", "true"]
    assert [m.headers["JMSXDeliveryCount"] for m in again] == ["2", "2"]


def test_nack_without_requeue_dead_letters(connect: Connect, admin: SyncClient) -> None:
    q, dla = unique(), unique("dla")
    admin.create_queue(q, dead_letter_address=dla)
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2])
    subscribe(conn, rec, q, "s", ack="client-individual")
    m1, m2 = rec.wait_messages(2)
    conn.nack(m1.headers["ack"], requeue="false")
    conn.ack(m2.headers["ack"], receipt="r")
    rec.wait_receipt("r")
    assert queue_depth(admin, q) == 0
    conn2, rec2 = connect()
    subscribe(conn2, rec2, dla, "d", ack="auto")
    [dead] = rec2.wait_messages(1)
    assert dead.body == "g-1"
    assert dead.headers["_AMQ_ORIG_QUEUE"] == q


# ---- group scenarios -----------------------------------------------------------------------------


def test_order_per_group_with_one_consumer(connect: Connect) -> None:
    q = unique()
    conn, rec = connect()
    receipt = unique("r")
    for seq in range(1, 31):
        for g in ("a", "b", "c"):
            last = seq == 30 and g == "c"
            conn.send(
                f"/queue/{q}",
                f"{g}{seq}",
                headers={"JMSXGroupID": g, "JMSXGroupSeq": str(seq)}
                | ({"receipt": receipt} if last else {}),
            )
    rec.wait_receipt(receipt)
    subscribe(conn, rec, q, "s", ack="auto", **{"activemq.prefetchSize": "7"})
    per: dict[str, list[int]] = defaultdict(list)
    for m in rec.wait_messages(90):
        per[m.headers["JMSXGroupID"]].append(int(m.headers["JMSXGroupSeq"]))
    assert per == {g: list(range(1, 31)) for g in ("a", "b", "c")}


def test_each_group_is_consumed_by_one_consumer_in_order(connect: Connect) -> None:
    q = unique()
    consumers = []
    for i in range(3):
        holder: dict[str, Any] = {}

        def ack(frame: Any, holder: dict[str, Any] = holder) -> None:
            holder["conn"].ack(frame.headers["ack"])

        conn, rec = connect(on_message=ack)
        holder["conn"] = conn
        subscribe(conn, rec, q, f"c{i}", ack="client-individual", **{"prefetch-count": "5"})
        consumers.append(rec)
    producer, prec = connect()
    for g in range(9):
        send_group(producer, prec, q, f"g{g}", list(range(1, 21)))
    wait_until(lambda: sum(len(r.messages) for r in consumers) >= 180, "180 messages")
    seen: dict[str, set[int]] = defaultdict(set)
    for i, rec in enumerate(consumers):
        per: dict[str, list[int]] = defaultdict(list)
        for m in rec.messages:
            per[m.headers["JMSXGroupID"]].append(int(m.headers["JMSXGroupSeq"]))
        for group, got in per.items():
            assert got == list(range(1, 21)), f"{group} at consumer {i}"
            seen[group].add(i)
    assert all(len(owners) == 1 for owners in seen.values()), seen
    assert {i for owners in seen.values() for i in owners} == {0, 1, 2}


@pytest.mark.parametrize("abrupt", [False, True])
def test_group_moves_when_its_consumer_leaves_with_unacked_messages(
    abrupt: bool, connect: Connect, raw: Callable[..., Raw]
) -> None:
    q = unique()
    a = raw()
    a.connect()
    a.send(
        encode_frame(
            "SUBSCRIBE", {"destination": f"/queue/{q}", "id": "a", "ack": "client-individual"}
        )
    )
    b, brec = connect()
    producer, prec = connect()
    send_group(producer, prec, q, "g", [1, 2, 3, 4, 5])
    got = [a.frame() for _ in range(5)]
    assert [f.headers["JMSXGroupSeq"] for f in got] == ["1", "2", "3", "4", "5"]
    a.send(encode_frame("ACK", {"id": got[0].headers["ack"]}))
    a.send(encode_frame("ACK", {"id": got[1].headers["ack"], "receipt": "acked"}))
    assert a.frame().headers["receipt-id"] == "acked"
    subscribe(b, brec, q, "b", ack="client-individual")  # g stays with a meanwhile
    if abrupt:
        a.close()
    else:
        a.send(encode_frame("DISCONNECT", {"receipt": "bye"}))
        assert a.frame().headers["receipt-id"] == "bye"
    moved = brec.wait_messages(3)
    assert seqs(moved) == [3, 4, 5]
    assert all(m.headers["redelivered"] == "true" for m in moved)
    assert all(m.headers["JMSXDeliveryCount"] == "2" for m in moved)


@pytest.mark.parametrize("close_group", [True, False])
def test_negative_sequence_closes_the_group(close_group: bool, connect: Connect) -> None:
    q = unique()
    a, arec = connect()
    subscribe(a, arec, q, "a", ack="client-individual")
    producer, prec = connect()
    send_group(producer, prec, q, "g", [1, 2, -3 if close_group else 3])
    for m in arec.wait_messages(3):
        a.ack(m.headers["ack"], receipt=f"ack-{m.headers['JMSXGroupSeq']}")
    arec.wait_receipt("ack--3" if close_group else "ack-3")
    send_group(producer, prec, q, "h", [1])  # a now owns h too, unacked
    arec.wait_messages(4)
    b, brec = connect()
    subscribe(b, brec, q, "b", ack="client-individual")
    send_group(producer, prec, q, "g", [4])
    if close_group:  # g was closed: it goes to the consumer with fewest groups
        [m] = brec.wait_messages(1)
    else:  # g is still pinned to a
        m = arec.wait_messages(5)[4]
    assert (m.headers["JMSXGroupID"], m.headers["JMSXGroupSeq"]) == ("g", "4")


def test_group_first_key_marks_the_first_message_of_each_group(
    connect: Connect, admin: SyncClient
) -> None:
    q = unique()
    admin.create_queue(q, group_first_key="JMSXGroupFirstForConsumer")
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2])
    send_group(conn, rec, q, "h", [1])
    subscribe(conn, rec, q, "s", ack="auto")
    first = {
        (m.headers["JMSXGroupID"], m.headers["JMSXGroupSeq"]): m.headers.get(
            "JMSXGroupFirstForConsumer"
        )
        for m in rec.wait_messages(3)
    }
    assert first == {("g", "1"): "true", ("g", "2"): None, ("h", "1"): "true"}


# ---- interoperability with gRPC ------------------------------------------------------------------


def test_stomp_to_grpc(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    conn, rec = connect()
    send_group(conn, rec, q, "g", [1, 2, 3], **{"x-from": "stomp"})
    got = admin.consume(q, 3)
    assert [(m.group_id, m.group_seq, m.body) for m in got] == [
        ("g", i, f"g-{i}".encode()) for i in (1, 2, 3)
    ]
    assert all(m.persistent and m.headers["x-from"] == "stomp" for m in got)


def test_grpc_to_stomp(connect: Connect, admin: SyncClient) -> None:
    q = unique()
    ids = [admin.send(q, f"b{i}", group_id="g", headers={"x-from": "grpc"}) for i in range(3)]
    conn, rec = connect()
    subscribe(conn, rec, q, "s", ack="client-individual")
    got = rec.wait_messages(3)
    assert [m.headers["message-id"] for m in got] == [str(i) for i in ids]
    assert [m.headers["JMSXGroupID"] for m in got] == ["g", "g", "g"]
    assert seqs(got) == [1, 2, 3]
    assert [m.body for m in got] == ["b0", "b1", "b2"]
    assert got[0].headers["x-from"] == "grpc"


# ---- heart-beats ---------------------------------------------------------------------------------


def test_heart_beats_both_ways_keep_an_idle_connection(connect: Connect) -> None:
    q = unique()
    conn, rec = connect(heartbeats=(100, 100))
    assert rec.connected["heart-beat"] == "100,100"
    rec.wait(lambda: rec.heartbeats >= 10, "10 heart-beats from the node")
    assert conn.is_connected() and not rec.disconnected
    send_group(conn, rec, q, "g", [1])  # still usable after a second of idling


def test_client_that_stops_heart_beating_is_closed(raw: Callable[..., Raw]) -> None:
    r = raw()
    connected = r.connect(**{"heart-beat": "100,0"})
    assert connected.headers["heart-beat"] == "0,100"
    frames = r.until_closed()  # the client promised a beat every 100 ms and sends nothing
    assert frames[-1].command == "ERROR"
    assert "heart-beat" in frames[-1].headers["message"]


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
