"""The load generator: a producer process and consumer processes speaking STOMP 1.2 (stomp.py).

Every process connects first, reports ready, then waits for the coordinator's go event, so
connection set-up is outside the timed region. Each stomp.py socket gets TCP_NODELAY (stomp.py
does not set it, and a receipt wait then costs about 40 ms of delayed ACK). A node's `Reach`
(harness.reach.PLAIN: plain text, no login) adds TLS and CONNECT's login and passcode.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import stomp
from harness.procs import die_with_parent
from harness.reach import Reach

BODY = "x" * 100
RECEIPT_EVERY = 100  # persistent sends per receipt wait
RECEIPT_TIMEOUT_S = 60.0
GO_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 600.0
POLL_S = 0.05
LINGER_S = 0.5  # after the last ack, how long consumers watch for redeliveries / duplicates


class _Listener(stomp.ConnectionListener):
    """Collects receipts and errors; forwards MESSAGE frames to `on_msg`."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.receipts: set[str] = set()
        self.errors: list[str] = []
        self.disconnected = False
        self.on_msg: Any = None

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.receipts.add(frame.headers.get("receipt-id", ""))
            self.cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self.cond:
            self.errors.append(f"{frame.headers.get('message', '')} {frame.body!r}"[:500])
            self.cond.notify_all()

    def on_disconnected(self) -> None:
        with self.cond:
            self.disconnected = True
            self.cond.notify_all()

    def on_message(self, frame: Any) -> None:
        if self.on_msg is not None:
            self.on_msg(frame)

    def wait_receipt(self, rid: str, timeout: float = RECEIPT_TIMEOUT_S) -> None:
        """Block until receipt `rid` arrives; raise on ERROR, disconnect or timeout."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while rid not in self.receipts:
                if self.errors:
                    raise RuntimeError(f"ERROR frame: {self.errors[0]}")
                if self.disconnected:
                    raise RuntimeError(f"disconnected while waiting for receipt {rid}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no receipt {rid} in {timeout:.0f} s")
                self.cond.wait(left)
            self.receipts.discard(rid)


def connect(host: str, port: int, reach: Reach) -> tuple[stomp.Connection12, _Listener]:
    """A STOMP 1.2 connection (CONNECT frame, no heart-beats) with TCP_NODELAY set; over TLS
    and logged in when `reach` says so."""
    conn = stomp.Connection12([(host, port)], timeout=10, reconnect_attempts_max=1)
    if reach.tls is not None:
        conn.set_ssl(for_hosts=[(host, port)], ca_certs=str(reach.tls.ca))
    listener = _Listener()
    conn.set_listener("bench", listener)
    login = reach.login()
    credentials = {} if login is None else {"username": login[0], "passcode": login[1]}
    conn.connect(wait=True, with_connect_command=True, **credentials)
    sock = conn.transport.socket
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn, listener


def close(conn: stomp.Connection12, listener: _Listener) -> None:
    """DISCONNECT with a receipt (bounded wait), then stop the transport."""
    try:
        if conn.is_connected():
            conn.disconnect(receipt="bye")
    except Exception:  # best effort: the run's figures are already taken
        pass
    finally:
        conn.transport.stop()


def _quiet_child() -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the coordinator handles Ctrl-C


# ---- producer ---------------------------------------------------------------------------------


def producer_main(
    host: str, port: int, dest: str, n: int, groups: int, go: Any, events: Any, reach: Reach
) -> None:
    """Send message i to group i % groups with seq i // groups + 1; a receipt every 100 sends."""
    _quiet_child()
    conn, listener = connect(host, port, reach)
    try:
        names = [f"g{g:04d}" for g in range(groups)]
        events.put(("ready", "producer"))
        if not go.wait(GO_TIMEOUT_S):
            raise TimeoutError("producer: no go")
        waits: list[float] = []
        cpu0, t0 = time.process_time(), time.time()
        for i in range(n):
            g = names[i % groups]
            headers = {
                "persistent": "true",
                "JMSXGroupID": g,
                "x-group": g,
                "x-seq": str(i // groups + 1),
            }
            last = (i + 1) % RECEIPT_EVERY == 0 or i == n - 1
            if last:
                headers["receipt"] = f"s{i}"
            conn.send(dest, BODY, headers=headers)
            if last:
                w0 = time.perf_counter()
                listener.wait_receipt(f"s{i}")
                waits.append(time.perf_counter() - w0)
        t1 = time.time()
        cpu = time.process_time() - cpu0
        events.put(("producer", {"t0": t0, "t1": t1, "sent": n, "cpu": cpu, "waits": waits}))
    finally:
        close(conn, listener)


# ---- consumers --------------------------------------------------------------------------------


@dataclass(slots=True)
class Seen:
    """What one consumer received, in arrival order (parallel lists)."""

    name: str
    groups: list[str] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    msg_ids: list[str] = field(default_factory=list)
    redelivered: int = 0
    missing_headers: int = 0
    extra: int = 0  # deliveries after all N were acked
    end: float = 0.0  # set by the consumer that acked the N-th message: its receipt time
    cpu: float = 0.0
    error: str = ""


def consumer_main(
    host: str,
    port: int,
    dest: str,
    name: str,
    prefetch: int,
    total: int,
    acked: Any,
    subscribe: Any,
    events: Any,
    reach: Reach,
) -> None:
    """Subscribe on `subscribe`, ack every message individually until `total` are acked overall."""
    _quiet_child()
    conn, listener = connect(host, port, reach)
    seen = Seen(name)
    lock = acked.get_lock()
    done = threading.Event()
    finishing = [False]
    mine = [False]  # whether this consumer acked the N-th message

    def on_msg(frame: Any) -> None:
        h = frame.headers
        g, q = h.get("x-group"), h.get("x-seq")
        if g is None or q is None:
            seen.missing_headers += 1
        else:
            seen.groups.append(g)
            seen.seqs.append(int(q))
        seen.msg_ids.append(h.get("message-id", ""))
        if h.get("redelivered") == "true":
            seen.redelivered += 1
        if finishing[0]:
            seen.extra += 1
            conn.ack(h["ack"])
            return
        with lock:  # `mine` is set under the lock, before anyone can read the N-th count
            acked.value += 1
            last = acked.value == total
            if last:
                mine[0] = True
        if last:
            conn.ack(h["ack"], receipt="last-ack")
            # Waiting here blocks stomp.py's receiver thread, which must read the receipt:
            # hand the wait to another thread.
            threading.Thread(target=_finish, daemon=True).start()
        else:
            conn.ack(h["ack"])

    def _finish() -> None:
        try:
            listener.wait_receipt("last-ack")
            seen.end = time.time()
        except Exception as err:
            seen.error = repr(err)
        done.set()

    listener.on_msg = on_msg
    try:
        events.put(("ready", name))
        if not subscribe.wait(GO_TIMEOUT_S):
            raise TimeoutError(f"{name}: no go")
        cpu0 = time.process_time()
        conn.subscribe(
            dest,
            id=name,
            ack="client-individual",
            headers={"activemq.prefetchSize": str(prefetch), "receipt": f"sub-{name}"},
        )
        listener.wait_receipt(f"sub-{name}")
        events.put(("subscribed", name))
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not done.is_set() and (mine[0] or acked.value < total):
            if listener.errors or listener.disconnected:
                raise RuntimeError(f"{name}: {listener.errors or 'disconnected'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: run not over after {RUN_TIMEOUT_S:.0f} s")
            done.wait(POLL_S)
        if seen.error:
            raise RuntimeError(f"{name}: {seen.error}")
        finishing[0] = True
        time.sleep(LINGER_S)
        seen.cpu = time.process_time() - cpu0  # includes the idle linger
        events.put(("consumer", seen))
    finally:
        close(conn, listener)


def drain(
    host: str, port: int, dest: str, subscriptions: int, reach: Reach, idle_s: float = 1.0
) -> int:
    """Messages still on `dest`: subscribe `subscriptions` times (auto ack), count until idle."""
    conn, listener = connect(host, port, reach)
    count = [0]
    last = [time.monotonic()]

    def on_msg(_frame: Any) -> None:
        count[0] += 1
        last[0] = time.monotonic()

    listener.on_msg = on_msg
    try:
        for k in range(subscriptions):
            conn.subscribe(dest, id=f"drain{k}", ack="auto", headers={"receipt": f"d{k}"})
            listener.wait_receipt(f"d{k}")
        last[0] = time.monotonic()
        deadline = last[0] + 30.0
        while time.monotonic() - last[0] < idle_s and time.monotonic() < deadline:
            time.sleep(0.05)
        return count[0]
    finally:
        close(conn, listener)
