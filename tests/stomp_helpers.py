"""STOMP tests' shared parts: a node with STOMP on (one per test module), stomp.py connections
that record what arrives, raw sockets for malformed input, and bounded waits.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import stomp
from conftest import NodeProcess, unique
from ports import reserve_port

from broker.client import SyncClient
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


@contextlib.contextmanager
def stomp_connections() -> Iterator[Connect]:
    """A maker of stomp.py connections (TCP_NODELAY set) to a port; all closed at the end."""
    opened: list[Any] = []

    def make(
        port: int,
        version: str = "1.2",
        *,
        heartbeats: tuple[int, int] = (0, 0),
        on_message: Callable[[Any], None] | None = None,
        auto_decode: bool = True,
        headers: dict[str, str] | None = None,
    ) -> tuple[Any, Recorder]:
        hosts = [("127.0.0.1", port)]
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

    try:
        yield make
    finally:
        for conn in opened:
            with contextlib.suppress(Exception):
                if conn.is_connected():
                    conn.disconnect()
            # Also when the node closed it: stomp.py's receiver thread ends only once its
            # transport stops running (one left behind spun a CPU for the rest of a run).
            with contextlib.suppress(Exception):
                conn.transport.disconnect_socket()


@pytest.fixture
def connect(snode: StompNode) -> Iterator[Connect]:
    """Open stomp.py connections to the module's node (or `port=`); closed at the end."""
    with stomp_connections() as make:

        def to(version: str = "1.2", *, port: int | None = None, **kw: Any) -> tuple[Any, Recorder]:
            return make(port or snode.port, version, **kw)

        yield to


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

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


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
    with Raw(port) as r:
        r.connect()
