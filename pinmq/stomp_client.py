"""An asyncio STOMP 1.2 client over an address list, auditing as the Python gRPC client does:
what `pinmq load --protocol stomp` drives, so a history can hold STOMP clients' side too.

It offers the part of `broker.client.Client` the load uses: `producer(queue, group_id).send`,
`consumer(queue)` with `receive` and `ack`, failover notices, and the same errors. One
connection per client, to the first address that answers; a lost one is replaced by one to
the next address (`on_failover` is told), trying them in turn for `failover_timeout` seconds.

What a lost connection means, as with gRPC: a frame not written was not sent
(`ConnectionLost`); a SEND or ACK written whose receipt never came may or may not have taken
effect (`OutcomeUnknown`). The producer sends such a SEND again on the new connection, the
same message with the same duplicate id (a node that took it drops the copy), for
`failover_timeout` seconds, as gRPC's producer does; an ACK in doubt is the caller's.
A message received on a connection since lost cannot be acked: the node delivers it again.
Frames are the node's own (pinmq/stomp/frames.py): one definition of the wire format.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from broker.audit import AuditLog
from broker.audit_schema import MID_HEADER, Kind
from broker.client import ConnectionLost, OutcomeUnknown, PinmqError, Refused, Unavailable
from broker.message import DUPLICATE_ID_HEADER, GROUP_ID_HEADER, GROUP_SEQ_HEADER
from broker.tls import TlsFiles
from pinmq.stomp.frames import Frame, FrameError, FrameParser, encode_frame
from pinmq.stomp.protocol import DELIVERY_COUNT_HEADER

CONNECT_TIMEOUT_S = 5.0
RECEIPT_TIMEOUT_S = 30.0
FAILOVER_TIMEOUT_S = 30.0
GOODBYE_S = 2.0  # how long a closing client waits for its DISCONNECT's receipt
RETRY_S = 0.2  # between rounds of the address list
PREFETCH = 100
SUBSCRIPTION = "load"


class _Link:
    """One connection: frames written, frames read by a task, receipts awaited by id."""

    def __init__(
        self,
        address: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        parser: FrameParser,
        on_message: Callable[[_Link, Frame], None],
    ) -> None:
        self.address, self._writer, self._parser = address, writer, parser
        self._receipts: dict[str, asyncio.Future[None]] = {}
        self._ids = itertools.count(1)
        self.lost: str | None = None  # why, once the connection is gone
        self._on_message = on_message
        self._reading = asyncio.ensure_future(self._read(reader))

    @classmethod
    async def open(
        cls,
        address: str,
        tls: ssl.SSLContext | None,
        login: dict[str, str],
        on_message: Callable[[_Link, Frame], None],
    ) -> _Link:
        """Connected and past CONNECT, or OSError/PinmqError saying why not."""
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, int(port), ssl=tls), CONNECT_TIMEOUT_S
        )
        parser = FrameParser()
        try:
            headers = {"accept-version": "1.2", "host": host, "heart-beat": "0,0", **login}
            writer.write(encode_frame("CONNECT", headers))
            answer = await asyncio.wait_for(_next_frame(reader, parser), CONNECT_TIMEOUT_S)
            if answer.command != "CONNECTED":  # bad credentials, say: no other node will do
                message = answer.headers.get("message", answer.command)
                raise Refused(f"{address} refused the connection: {message}")
        except BaseException:
            writer.close()
            raise
        parser.escaping = True  # 1.2, from the next frame on
        return cls(address, reader, writer, parser, on_message)

    async def request(self, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        """Write the frame with a receipt and wait for it."""
        if self.lost is not None:
            raise ConnectionLost(f"not sent: the connection to {self.address} is lost")
        receipt = f"r{next(self._ids)}"
        done = self._receipts[receipt] = asyncio.get_running_loop().create_future()
        self._writer.write(encode_frame(command, {**headers, "receipt": receipt}, body))
        try:
            await asyncio.wait_for(done, RECEIPT_TIMEOUT_S)
        except TimeoutError:
            self.close(f"no receipt within {RECEIPT_TIMEOUT_S:.0f} s")
            raise OutcomeUnknown(
                f"{command} to {self.address}: no receipt within {RECEIPT_TIMEOUT_S:.0f} s"
            ) from None
        finally:
            self._receipts.pop(receipt, None)

    def close(self, why: str = "closed") -> None:
        self._end(why, "the connection ended")
        self._reading.cancel()

    def _end(self, why: str, what: str) -> None:
        """The connection is gone (`why`, kept if it was already): each frame still awaiting
        its receipt has an unknown outcome, since `what` came first."""
        if self.lost is None:
            self.lost = why
            self._writer.close()
        for receipt in self._receipts.values():
            if not receipt.done():
                receipt.set_exception(OutcomeUnknown(f"{self.address}: {what} before the receipt"))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        why = "the node closed the connection"
        try:
            while True:
                frame = await _next_frame(reader, self._parser)
                if frame.command == "RECEIPT":
                    done = self._receipts.get(frame.headers.get("receipt-id", ""))
                    if done is not None and not done.done():
                        done.set_result(None)
                elif frame.command == "MESSAGE":
                    self._on_message(self, frame)
                elif frame.command == "ERROR":
                    why = frame.headers.get("message", "ERROR")
                    done = self._receipts.get(frame.headers.get("receipt-id", ""))
                    if done is not None and not done.done():
                        done.set_exception(Refused(f"{self.address}: {why}"))
                    break
        except (OSError, EOFError, FrameError) as err:
            why = str(err) or type(err).__name__
        except asyncio.CancelledError:
            return
        self._end(why, why)  # not close(): it would cancel this very task as it ends


async def _next_frame(reader: asyncio.StreamReader, parser: FrameParser) -> Frame:
    while (frame := parser.next()) is None:
        data = await reader.read(65536)
        if not data:
            raise EOFError("the node closed the connection")
        parser.feed(data)
    return frame


@dataclass
class StompMessage:
    """A MESSAGE as the consumer got it; `ack` settles it on the connection it came on."""

    body: bytes
    headers: dict[str, str]
    _link: _Link = field(repr=False)
    _consumer: StompConsumer = field(repr=False)

    async def ack(self, wait: bool = True) -> None:
        """Settle it, always waiting for the node's receipt: `wait` is taken for the gRPC
        client's `Received.ack` signature, which the load's workers call, and not used."""
        await self._consumer.ack(self)


class StompClient:
    """Connections to the nodes `url` lists (comma-separated STOMP `host:port`s)."""

    def __init__(
        self,
        url: str,
        *,
        tls: TlsFiles | None = None,
        user: str | None = None,
        password: str | None = None,
        audit: str | Path | None = None,
        audit_name: str | None = None,
        on_failover: Callable[[str], None] | None = None,
        failover_timeout: float = FAILOVER_TIMEOUT_S,
    ) -> None:
        self.addresses = [a.strip() for a in url.split(",") if a.strip()]
        if not self.addresses:
            raise ValueError("no STOMP address given")
        self.user = user
        self._tls = tls.client_context() if tls is not None else None
        self._login = {"login": user, "passcode": password or ""} if user else {}
        self._audit_dir = Path(audit) if audit is not None else None
        self._audit_name = audit_name or f"client-{uuid.uuid4().hex[:8]}"
        self.audit: AuditLog | None = None
        self._on_failover = on_failover
        self.failover_timeout = failover_timeout
        self._link: _Link | None = None
        self._next = 0  # the address the next connection tries first
        self._linking = asyncio.Lock()
        self._producers = itertools.count(1)
        self.consumers: list[StompConsumer] = []

    async def __aenter__(self) -> Self:
        link = await self.link(first=True)
        if self._audit_dir is not None:
            self.audit = AuditLog(self._audit_dir, self._audit_name, node=link.address).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._link is not None:
            if self._link.lost is None:  # a polite goodbye: the node has what came before
                with contextlib.suppress(PinmqError, TimeoutError):
                    await asyncio.wait_for(self._link.request("DISCONNECT", {}), GOODBYE_S)
            self._link.close()
            self._link = None
        if self.audit is not None:
            self.audit.close()
            self.audit = None

    async def link(self, first: bool = False) -> _Link:
        """The live connection, or a new one: the addresses in turn from the one after the
        last, for `failover_timeout` seconds (Unavailable then). The `first` connection
        tries each once: a wrong address is the user's to fix, not to wait for."""
        async with self._linking:
            if self._link is not None and self._link.lost is None:
                return self._link
            lost = self._link
            deadline = time.monotonic() + self.failover_timeout
            errors: list[str] = []
            while True:
                for _ in self.addresses:
                    address = self.addresses[self._next]
                    self._next = (self._next + 1) % len(self.addresses)
                    try:
                        link = await _Link.open(address, self._tls, self._login, self._arrived)
                    except (OSError, TimeoutError, EOFError, FrameError, Unavailable) as err:
                        errors.append(f"{address}: {err or type(err).__name__}")
                        continue
                    if not await self._resubscribe(link):
                        errors.append(f"{address}: {link.lost}")
                        continue
                    self._link = link
                    if lost is not None and self._on_failover is not None:
                        self._on_failover(f"moved to {address} ({lost.address}: {lost.lost})")
                    return link
                if first or time.monotonic() >= deadline:
                    within = "" if first else f" within {self.failover_timeout:.0f} s"
                    raise Unavailable(
                        f"no node of {','.join(self.addresses)} answered{within}: {errors[-1]}"
                    )
                await asyncio.sleep(RETRY_S)

    def producer(self, queue: str, group_id: str) -> StompProducer:
        return StompProducer(self, queue, group_id, f"{self._audit_name}.p{next(self._producers)}")

    @contextlib.asynccontextmanager
    async def consumer(self, queue: str) -> AsyncIterator[StompConsumer]:
        """A client-individual subscription to `queue` (one per client)."""
        if self.consumers:
            raise ValueError("one consumer per STOMP client")
        consumer = StompConsumer(self, queue)
        link = await self.link()
        self.consumers.append(consumer)  # from now on every new connection subscribes it
        try:
            with contextlib.suppress(ConnectionLost, OutcomeUnknown):  # the next one will
                await link.request("SUBSCRIBE", consumer.subscribe_headers())
            yield consumer
        finally:
            self.consumers.remove(consumer)

    async def _resubscribe(self, link: _Link) -> bool:
        try:
            for consumer in self.consumers:
                await link.request("SUBSCRIBE", consumer.subscribe_headers())
        except PinmqError:
            link.close()
            return False
        return True

    def _arrived(self, link: _Link, frame: Frame) -> None:
        for consumer in self.consumers:
            consumer.arrived(StompMessage(frame.body, frame.headers, link, consumer))

    def record(self, kind: Kind, headers: dict[str, str], **fields: Any) -> None:
        """An audit event of a message with these headers (nothing without an audit log)."""
        if self.audit is None:
            return
        mid = headers.get(MID_HEADER)
        seq = headers.get(GROUP_SEQ_HEADER)
        self.audit.record(
            kind,
            mid=mid,
            group=headers.get(GROUP_ID_HEADER),
            group_seq=int(seq) if seq else None,
            producer=mid.rpartition("/")[0] or None if mid else None,
            user=self.user,
            **fields,
        )


class StompProducer:
    """Persistent sends of one group, each waiting for its receipt; every message carries
    its end-to-end id (`pinmq-mid`) and, as its duplicate id, the same."""

    def __init__(self, client: StompClient, queue: str, group_id: str, producer_id: str) -> None:
        self._client, self.queue, self.group_id = client, queue, group_id
        self.producer_id = producer_id
        self._seq = itertools.count(1)

    async def send(self, body: bytes) -> None:
        seq = next(self._seq)
        mid = f"{self.producer_id}/{seq}"
        headers = {
            "destination": f"/queue/{self.queue}",
            "persistent": "true",
            GROUP_ID_HEADER: self.group_id,
            GROUP_SEQ_HEADER: str(seq),
            MID_HEADER: mid,
            DUPLICATE_ID_HEADER: mid,
        }
        maybe_done: OutcomeUnknown | None = None
        deadline = 0.0
        while True:
            try:
                link = await self._client.link()
            except Unavailable as gave_up:
                if maybe_done is None:
                    raise
                raise OutcomeUnknown(f"{maybe_done}; no node to send it again: {gave_up}") from None
            try:
                await link.request("SEND", headers, body)
            except ConnectionLost:
                continue  # never written: send it on the next connection
            except OutcomeUnknown as err:  # sent again, as gRPC's producer does: a node that
                if maybe_done is None:  # took it drops the copy by its duplicate id
                    maybe_done, deadline = err, time.monotonic() + self._client.failover_timeout
                elif time.monotonic() >= deadline:
                    raise
                continue
            break
        self._client.record(Kind.CLIENT_SENT, headers, node=link.address, address=self.queue)


class StompConsumer:
    """Messages of one subscription as they arrive, whichever connection brought them."""

    def __init__(self, client: StompClient, queue: str) -> None:
        self._client, self.queue = client, queue
        self._inbox: asyncio.Queue[StompMessage] = asyncio.Queue()

    def subscribe_headers(self) -> dict[str, str]:
        return {
            "destination": f"/queue/{self.queue}",
            "id": SUBSCRIPTION,
            "ack": "client-individual",
            "activemq.prefetchSize": str(PREFETCH),
        }

    def arrived(self, message: StompMessage) -> None:
        count = message.headers.get(DELIVERY_COUNT_HEADER, "1")
        self._record(
            Kind.CLIENT_RECEIVED, message, delivery_count=int(count) if count.isdigit() else 1
        )
        self._inbox.put_nowait(message)

    async def receive(self, timeout: float) -> StompMessage | None:
        """The next message, or None after `timeout` seconds (a lost connection is replaced
        first: Unavailable when no node answers)."""
        await self._client.link()
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(self._inbox.get(), timeout)
        return None

    async def ack(self, message: StompMessage) -> None:
        if message._link.lost is not None or message._link is not self._client._link:
            raise ConnectionLost("its connection is lost: the node delivers it again")
        ack_id = message.headers.get("ack")
        if ack_id is None:
            raise PinmqError("a MESSAGE without an ack header")
        self._record(Kind.CLIENT_ACKED, message)  # as the gRPC client: once the ACK is sent
        await message._link.request("ACK", {"id": ack_id})

    def _record(self, kind: Kind, message: StompMessage, **extra: Any) -> None:
        h = message.headers
        msg_id = h.get("message-id", "")
        self._client.record(
            kind,
            h,
            node=message._link.address,
            msg_id=int(msg_id) if msg_id.isdigit() else None,
            address=self.queue,
            queue=self.queue,
            consumer_name=SUBSCRIPTION,
            **extra,
        )
