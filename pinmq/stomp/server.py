"""The STOMP listener: the asyncio shell that moves bytes between sockets and sessions.

Each connection runs a reader (socket -> parser -> session -> core), a writer (everything
queued for the connection, written in one batch per wake-up with a single drain) and, once
heart-beats are negotiated, a heart-beat timer. A connection can only ever slow itself down:
its consumers get no more than their prefetch while its socket is full (auto-mode messages are
acknowledged only after they were written), and a client that does not read its RECEIPTs is
no longer read from once too many are queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from broker import logs
from broker.authenticator import Authenticator
from broker.engine import Engine
from broker.refusals import Refusals
from broker.sending import SendPath
from pinmq.stomp.protocol import CLOSE, Subscription
from pinmq.stomp.session import Session

READ_CHUNK = 256 * 1024
WRITE_SLICE = 1024 * 1024  # bytes per socket write (and drain) at most, big bodies aside
HIGH_WATER = 4 * 1024 * 1024  # queued control frames (receipts) before reading pauses
PAUSE_PARTIAL = 64 * 1024  # a partial frame this big waits for room when memory is full
HANDSHAKE_TIMEOUT_S = 10.0  # a client that opens a socket and stalls its TLS handshake
CLOSE_GRACE_S = 5.0  # to flush the last frames (ERROR, RECEIPT) before closing anyway
log = logs.get("stomp")


def _subject(writer: asyncio.StreamWriter) -> str | None:
    """The common name of the client certificate the TLS handshake verified, if any."""
    cert = writer.get_extra_info("peercert")
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class _BufferedReader(asyncio.StreamReaderProtocol, asyncio.BufferedProtocol):
    """A stream protocol that asyncio reads into a buffer the listener's connections share.

    For a plain protocol asyncio allocates a fresh 256 KiB bytes object for every read, from
    the socket and from TLS alike, which is above the node's mmap threshold (process.py): an
    mmap and a munmap per read. Reading into one buffer and copying out what arrived is safe
    to share, since asyncio fills the buffer and hands it over in one step of the loop.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        accept: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
        buffer: memoryview,
    ) -> None:
        super().__init__(reader, accept)
        self._buffer = buffer

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._buffer[:nbytes].tobytes())


class StompServer:
    """Serves STOMP on `listen.stomp` for one node."""

    def __init__(
        self,
        engine: Engine,
        sending: SendPath,
        authenticator: Authenticator | None = None,
        refusals: Refusals | None = None,
    ) -> None:
        self.engine = engine
        self.sending = sending
        self.authenticator = authenticator
        self.refusals = refusals if refusals is not None else Refusals()
        self.address = engine.config.listen.stomp
        self.connections: set[Connection] = set()
        self._server: asyncio.Server | None = None
        self._stopping = False
        self._ids = itertools.count(1)

    async def start(self, accept: bool = True) -> None:
        """Bind and (unless `accept` is False: then `accept()` later) accept; raises OSError
        naming the address when it cannot listen."""
        host, port = split_host_port(self.address)
        tls = self.engine.config.tls
        try:
            loop = asyncio.get_running_loop()
            buffer = memoryview(bytearray(READ_CHUNK))  # every connection's reads, in turn
            self._server = await loop.create_server(
                lambda: _BufferedReader(asyncio.StreamReader(), self._accept, buffer),
                host,
                port,
                backlog=self.engine.config.stomp.listen_backlog,
                start_serving=accept,
                ssl=tls.files().server_context(tls.client_auth) if tls is not None else None,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if tls is not None else None,
            )
        except OSError as err:
            reason = os.strerror(err.errno) if err.errno else str(err)
            raise OSError(f"cannot listen on {self.address} for STOMP: {reason}") from None

    async def accept(self) -> None:
        """Begin accepting connections on the address `start` bound."""
        if self._server is not None:
            await self._server.start_serving()

    async def stop(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Stop accepting; tell every client the node is going, then drop what is left."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.session.fail("the node is shutting down")
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._stopping:  # its TLS handshake ended after `stop` looked: it would outlive it
            writer.close()
            return
        session_id = f"stomp-{next(self._ids)}"
        conn = Connection(
            self.engine, self.sending, reader, writer, session_id, self.authenticator, self.refusals
        )
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)


class Connection:
    """One client socket and its session."""

    def __init__(
        self,
        engine: Engine,
        sending: SendPath,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        session_id: str,
        authenticator: Authenticator | None,
        refusals: Refusals,
    ) -> None:
        self.engine = engine
        self.reader = reader
        self.writer = writer
        self.loop = asyncio.get_running_loop()
        self.out: asyncio.Queue[Any] = asyncio.Queue()
        peer = writer.get_extra_info("peername")
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.session = Session(
            engine, sending, session_id, self.out, where, authenticator, _subject(writer), refusals
        )
        self.session.on_closing = self._closing
        self.connect_timeout_ms = engine.config.stomp.connect_timeout_ms
        self.frame_timeout_ms = engine.config.stomp.frame_timeout_ms
        self.task = asyncio.current_task()
        self.last_read = self.last_write = self.loop.time()

    async def run(self) -> None:
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        session = self.session
        writer_task = asyncio.create_task(self._write_loop())
        beats: asyncio.Task[None] | None = None
        try:
            beats = await self._read_loop()
        except (ConnectionError, OSError):
            pass  # the client went away; what it sent in full was applied
        except Exception as err:
            log.exception("stomp connection failed", session=session.id, error=str(err))
            session.fail("internal error")
        finally:
            session.close()
            if beats is not None:
                beats.cancel()
            if session.closing:  # let the ERROR / RECEIPT reach the client
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(CLOSE_GRACE_S):
                        await asyncio.shield(writer_task)
            writer_task.cancel()
            await asyncio.gather(writer_task, return_exceptions=True)
            self.writer.close()
            if session.error is not None:  # one line per connection, never per message
                log.info("stomp error", session=session.id, peer=session.peer, error=session.error)

    async def _read_loop(self) -> asyncio.Task[None] | None:
        """Read until EOF or the session closes; returns the heart-beat task, if started."""
        reader, session, loop = self.reader, self.session, self.loop
        beats: asyncio.Task[None] | None = None
        deadline = loop.time() + self.connect_timeout_ms / 1000
        frame_deadline = 0.0
        try:
            while not session.closing:
                # Before CONNECT, and once a frame has begun, the read has a deadline.
                if session.version is None:
                    limit, late = deadline, f"no CONNECT frame within {self.connect_timeout_ms}"
                elif session.parser.buffered:
                    limit, late = (
                        frame_deadline,
                        f"frame not completed within {self.frame_timeout_ms}",
                    )
                else:
                    limit = late = None
                if limit is None:
                    data = await reader.read(READ_CHUNK)
                else:
                    try:
                        async with asyncio.timeout_at(limit):
                            data = await reader.read(READ_CHUNK)
                    except TimeoutError:
                        session.fail(f"{late} ms")
                        return beats
                if not data:
                    return beats
                self.last_read = loop.time()
                frames = session.frames
                began = not session.parser.buffered
                await session.receive(data)
                if session.parser.buffered and (began or session.frames != frames):
                    frame_deadline = loop.time() + self.frame_timeout_ms / 1000  # a frame began
                if beats is None and any(session.heart_beat) and not session.closing:
                    beats = asyncio.create_task(self._heart_beats())
                if session.partial >= PAUSE_PARTIAL and self.engine.memory.full:
                    # A big partial frame holds memory: read no more of it until there is
                    # room, the frame's deadline still running.
                    try:
                        async with asyncio.timeout_at(frame_deadline):
                            await self.engine.room.memory_room()
                    except TimeoutError:
                        session.fail(
                            f"frame not completed within {self.frame_timeout_ms} ms "
                            "(the node's memory is full: limits.global-max-size)"
                        )
                        return beats
                if session.pending_bytes > HIGH_WATER:
                    session.drained.clear()
                    await session.drained.wait()
                    self.last_read = loop.time()
        except BaseException:
            if beats is not None:
                beats.cancel()
            raise
        return beats

    async def _write_loop(self) -> None:
        """Write everything queued at once, drain once; auto acks follow the drain."""
        out, session = self.out, self.session
        try:
            while True:
                items = [await out.get()]
                while not out.empty():
                    items.append(out.get_nowait())
                parts: list[bytes] = []
                auto: dict[Subscription, list[int]] | None = None
                control = 0
                close = False
                for item in items:
                    if item.__class__ is list:
                        auto = session.render(item, parts, auto)
                    elif item.__class__ is bytes:
                        parts.append(item)
                        control += len(item)
                    elif item is CLOSE:
                        close = True
                        break
                if parts:
                    await self._write(parts)
                session.written(control)
                if session.pending_bytes <= HIGH_WATER // 2:
                    session.drained.set()
                if auto:
                    session.auto_ack(auto)
                if close:
                    return
        except (ConnectionError, OSError):
            pass
        except Exception as err:
            log.exception("stomp writer failed", session=session.id, error=str(err))
        finally:
            session.drained.set()
            self.writer.close()  # the reader sees EOF and cleans up

    async def _write(self, parts: list[bytes]) -> None:
        """One write and one drain for what is ready, in slices of WRITE_SLICE bytes at most,
        so that large messages are never all copied into the transport's buffer at once."""
        writer = self.writer
        start, size = 0, 0
        for i, part in enumerate(parts):
            size += len(part)
            if size >= WRITE_SLICE:
                writer.write(b"".join(parts[start : i + 1]))
                self.last_write = self.loop.time()
                await writer.drain()
                start, size = i + 1, 0
        if start < len(parts):
            writer.write(b"".join(parts[start:]))
            self.last_write = self.loop.time()
            await writer.drain()

    async def _heart_beats(self) -> None:
        """Send an EOL when idle; close the connection when the client's beats stop."""
        send_ms, expect_ms = self.session.heart_beat
        # Checked four times per interval, a beat after half an idle interval keeps every gap
        # well under the 1.5x that clients such as stomp.py tolerate, even on a busy loop.
        period = min(ms / 4000 for ms in (send_ms, expect_ms) if ms)
        loop, session = self.loop, self.session
        while not session.closing:
            await asyncio.sleep(period)
            now = loop.time()
            if send_ms and now - self.last_write >= send_ms / 2000:
                self.last_write = now
                session.heart_beat_now()
            if expect_ms and now - self.last_read > 2 * expect_ms / 1000:
                session.fail(f"no frame or heart-beat from the client for {2 * expect_ms} ms")
                return

    def _closing(self) -> None:
        """The session is closing: a client that reads nothing must not keep it open."""
        self.loop.call_later(CLOSE_GRACE_S, _abort, self.writer.transport)


def _abort(transport: asyncio.WriteTransport) -> None:
    """Abort a connection that may be gone by now. The TLS transport of Python 3.11.2 (Debian
    12's, the image's) raises AttributeError when aborted after it was closed twice; 3.11.7
    checks. Nothing is left to abort then."""
    with contextlib.suppress(AttributeError):
        transport.abort()
