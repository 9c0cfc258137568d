"""A do-nothing STOMP 1.2 sink: the load generator's ceiling, measured through the same workload.

It keeps messages in memory only (no persistence, no fsync), answers every `receipt` header,
and routes like a minimal group-aware queue so that the same verification applies: dispatch
starts once `need` subscriptions exist on a destination, a new group goes to the subscription
with the fewest groups and stays there, and `client-individual` subscriptions get at most
`activemq.prefetchSize` unacknowledged messages. What one read produces (MESSAGEs, RECEIPTs) is
written per connection in one call. One asyncio thread, run as its own process.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import sys
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from harness.procs import reserve_port, spawn, stop

from stomp_load.ready import wait_stomp

_PASS = (b"x-group", b"x-seq", b"JMSXGroupID", b"persistent")


@dataclass(eq=False, slots=True)
class _Sub:
    conn: _Conn
    sid: bytes
    dest: bytes
    client_ack: bool
    prefetch: int
    pending: deque[tuple[bytes, bytes]] = field(default_factory=deque)
    unacked: int = 0
    groups: int = 0


@dataclass(eq=False, slots=True)
class _Dest:
    backlog: deque[tuple[bytes, bytes, bytes]] = field(default_factory=deque)  # group, hdrs, body
    subs: list[_Sub] = field(default_factory=list)
    owner: dict[bytes, _Sub] = field(default_factory=dict)
    started: bool = False


class _Sink:
    def __init__(self, need: int) -> None:
        self.need = need
        self.dests: dict[bytes, _Dest] = {}
        self.ids = itertools.count(1)
        self.dirty: set[_Conn] = set()  # connections with output to flush after this read

    def write(self, conn: _Conn, data: bytes) -> None:
        """Queue `data` for `conn`; written in one call when the current read is processed."""
        conn.out.append(data)
        self.dirty.add(conn)

    def flush(self) -> None:
        for conn in self.dirty:
            conn.transport.write(b"".join(conn.out))
            conn.out.clear()
        self.dirty.clear()

    def dest(self, name: bytes) -> _Dest:
        d = self.dests.get(name)
        if d is None:
            d = self.dests[name] = _Dest()
        return d

    def route(self, d: _Dest, group: bytes, hdrs: bytes, body: bytes) -> None:
        sub = d.owner.get(group)
        if sub is None:
            sub = min(d.subs, key=lambda s: s.groups)
            sub.groups += 1
            d.owner[group] = sub
        sub.pending.append((hdrs, body))
        self.pump(sub)

    def pump(self, sub: _Sub) -> None:
        out = sub.conn.out
        n = len(out)
        while sub.pending and (not sub.client_ack or sub.unacked < sub.prefetch):
            hdrs, body = sub.pending.popleft()
            mid = next(self.ids)
            out.append(
                b"MESSAGE\nsubscription:%s\nmessage-id:%d\ndestination:%s\nack:%d\n%s"
                b"content-length:%d\n\n%s\x00"
                % (sub.sid, mid, sub.dest, mid, hdrs, len(body), body)
            )
            if sub.client_ack:
                sub.unacked += 1
                sub.conn.acks[b"%d" % mid] = sub
        if len(out) > n:
            self.dirty.add(sub.conn)


class _Conn(asyncio.Protocol):
    def __init__(self, sink: _Sink) -> None:
        self.sink = sink
        self.buf = bytearray()
        self.subs: dict[bytes, _Sub] = {}
        self.acks: dict[bytes, _Sub] = {}
        self.out: list[bytes] = []
        self.transport: asyncio.Transport = None  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        for sub in list(self.subs.values()):
            self._unsubscribe(sub)
        self.sink.dirty.discard(self)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        while True:
            while pos < len(buf) and buf[pos] in (10, 13):  # heart-beat EOLs
                pos += 1
            end = buf.find(b"\n\n", pos)
            if end < 0:
                break
            head = bytes(buf[pos:end]).split(b"\n")
            headers: dict[bytes, bytes] = {}
            for line in head[1:]:
                k, _, v = line.partition(b":")
                headers.setdefault(k, v.rstrip(b"\r"))
            length = headers.get(b"content-length")
            if length is not None:
                stop_at = end + 2 + int(length)
                if len(buf) < stop_at + 1:
                    break
                body = bytes(buf[end + 2 : stop_at])
            else:
                stop_at = buf.find(b"\x00", end + 2)
                if stop_at < 0:
                    break
                body = bytes(buf[end + 2 : stop_at])
            pos = stop_at + 1
            self.frame(head[0].rstrip(b"\r"), headers, body)
        del buf[:pos]
        self.sink.flush()

    def frame(self, cmd: bytes, h: dict[bytes, bytes], body: bytes) -> None:
        sink = self.sink
        if cmd == b"SEND":
            d = sink.dest(h[b"destination"])
            hdrs = b"".join(b"%s:%s\n" % (k, h[k]) for k in _PASS if k in h)
            group = h.get(b"JMSXGroupID", b"")
            if d.started:
                sink.route(d, group, hdrs, body)
            else:
                d.backlog.append((group, hdrs, body))
        elif cmd == b"ACK":
            sub = self.acks.pop(h[b"id"], None)
            if sub is not None:
                sub.unacked -= 1
                sink.pump(sub)
        elif cmd == b"SUBSCRIBE":
            dest = h[b"destination"]
            sub = _Sub(
                self,
                h[b"id"],
                dest,
                h.get(b"ack", b"auto") != b"auto",
                int(h.get(b"activemq.prefetchSize", b"1000")),
            )
            self.subs[sub.sid] = sub
            d = sink.dest(dest)
            d.subs.append(sub)
            if not d.started and len(d.subs) >= sink.need:
                d.started = True
                while d.backlog:
                    sink.route(d, *d.backlog.popleft())
            elif d.started:
                sink.pump(sub)
        elif cmd == b"UNSUBSCRIBE":
            sub = self.subs.get(h[b"id"])
            if sub is not None:
                self._unsubscribe(sub)
        elif cmd in (b"CONNECT", b"STOMP"):
            sink.write(self, b"CONNECTED\nversion:1.2\nheart-beat:0,0\n\n\x00")
        if b"receipt" in h:
            sink.write(self, b"RECEIPT\nreceipt-id:%s\n\n\x00" % h[b"receipt"])
        if cmd == b"DISCONNECT":
            sink.flush()
            self.transport.close()

    def _unsubscribe(self, sub: _Sub) -> None:
        """Forget `sub`; its groups become unowned (unacked messages are simply dropped)."""
        self.subs.pop(sub.sid, None)
        d = self.sink.dest(sub.dest)
        if sub in d.subs:
            d.subs.remove(sub)
        for g in [g for g, s in d.owner.items() if s is sub]:
            del d.owner[g]
        if not d.subs:
            d.started = False


def serve(port: int, need: int) -> None:
    """Run the sink on 127.0.0.1:`port` until SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stopped = loop.create_future()
        loop.add_signal_handler(signal.SIGTERM, stopped.set_result, None)
        sink = _Sink(need)
        server = await loop.create_server(lambda: _Conn(sink), "127.0.0.1", port)
        async with server:
            await stopped

    asyncio.run(main())


@contextmanager
def running_sink(workdir: Path, need: int) -> Iterator[tuple[str, int, int]]:
    """The sink as a subprocess on a free loopback port: (host, port, pid); stopped on exit."""
    port = reserve_port()
    log_path = workdir / "sink.log"
    code = f"from stomp_load.sink import serve; serve({port}, {need})"
    with log_path.open("ab") as log:
        proc = spawn([sys.executable, "-c", code], log, cwd=Path(__file__).resolve().parents[1])
    try:
        wait_stomp("127.0.0.1", port, proc, log_path, 20.0, "STOMP sink")
        yield "127.0.0.1", port, proc.pid
    finally:
        stop(proc, grace=5.0)
