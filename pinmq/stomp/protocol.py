"""STOMP as pinmq speaks it, apart from any connection: versions, heart-beats, destinations,
prefetch, ack modes, and the bookkeeping of a subscription and a transaction (pure).
"""

from __future__ import annotations

import importlib.metadata
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from broker.budget import Meter
from broker.message import Outgoing
from broker.streams import ConsumerStream
from pinmq.stomp.frames import Frame

VERSIONS: Final = ("1.0", "1.1", "1.2")
try:
    SERVER: Final = f"pinmq/{importlib.metadata.version('pinmq')}"
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    SERVER: Final = "pinmq"  # type: ignore[misc]
ACK_MODES: Final = frozenset({"auto", "client", "client-individual"})
PREFETCH_HEADERS: Final = ("activemq.prefetchSize", "prefetch-count")
DELIVERY_COUNT_HEADER: Final = "JMSXDeliveryCount"
MAX_SUBSCRIPTIONS: Final = 1000  # on one connection
MAX_TRANSACTIONS: Final = 1000  # open at once on one connection
MAX_TRANSACTION_BYTES: Final = 64 * 1024 * 1024  # bodies buffered by one connection's transactions

# SEND headers that steer the broker rather than travel with the message.
SEND_ONLY = frozenset({"destination", "receipt", "transaction", "content-length", "persistent"})
# MESSAGE headers the broker sets; a sender's header of the same name is not passed on.
MESSAGE_OWN = frozenset(
    {
        "subscription",
        "message-id",
        "destination",
        "ack",
        "content-length",
        "persistent",
        "redelivered",
        DELIVERY_COUNT_HEADER,
    }
)
AUTO, CLIENT, INDIVIDUAL = 0, 1, 2
MODES = {"auto": AUTO, "client": CLIENT, "client-individual": INDIVIDUAL}


class ProtocolError(Exception):
    """A frame the session refuses: it becomes an ERROR frame and the connection closes."""


class Close:
    """Put on `out` after the last frame: the writer closes the connection there."""


CLOSE: Final = Close()


def negotiate_version(accept_version: str | None) -> str | None:
    """The highest version both sides speak; a CONNECT without accept-version means 1.0."""
    if accept_version is None:
        return "1.0"
    offered = {v.strip() for v in accept_version.split(",")}
    common = [v for v in VERSIONS if v in offered]
    return common[-1] if common else None


def negotiate_heart_beat(client: str | None, server_ms: int) -> tuple[int, int]:
    """(ms between the node's heart-beats, ms the node expects between the client's); 0 = off.

    The client's `cx,cy` says how often it can send and wants to receive; the node offers
    `server_ms` both ways, so each direction runs at the slower of the two (STOMP 1.1).
    """
    if not client or not server_ms:
        return 0, 0
    cx_raw, sep, cy_raw = client.partition(",")
    try:
        cx, cy = int(cx_raw), int(cy_raw)
    except ValueError:
        cx = cy = -1
    if not sep or cx < 0 or cy < 0:
        raise ProtocolError(f"invalid heart-beat header {client[:40]!r}: expected 'cx,cy'")
    return (max(server_ms, cy) if cy else 0), (max(server_ms, cx) if cx else 0)


def queue_name(destination: str) -> str:
    """`/queue/NAME` or a bare `NAME` names the anycast queue (and address) NAME."""
    name = destination.removeprefix("/queue/") if destination.startswith("/queue/") else None
    if name is None and not destination.startswith("/"):
        name = destination
    if not name:
        raise ProtocolError(
            f"unsupported destination {destination[:100]!r}: expected /queue/NAME or NAME"
        )
    return name


def prefetch_of(headers: Mapping[str, str], default: int) -> int:
    for key in PREFETCH_HEADERS:
        raw = headers.get(key)
        if raw is not None:
            try:
                value = int(raw)
            except ValueError:
                value = 0
            if value < 1:
                raise ProtocolError(f"{key} must be a positive integer, got {raw[:20]!r}")
            return value
    return default


def required(frame: Frame, name: str) -> str:
    value = frame.headers.get(name)
    if value is None:
        raise ProtocolError(f"{frame.command} frame requires a {name!r} header")
    return value


# ---- subscriptions and transactions -------------------------------------------------------------


@dataclass(slots=True, eq=False)
class Subscription:
    """One SUBSCRIBE: a consumer of the core, with the bookkeeping its ack mode needs."""

    id: str
    consumer_id: str
    queue: str
    mode: int  # AUTO, CLIENT or INDIVIDUAL
    stream: ConsumerStream
    head: str  # "MESSAGE\nsubscription:ID\n", rendered once
    ack_prefix: str | None  # "ack:CONSUMER/" (STOMP 1.2, acknowledged modes)
    first_line: str | None  # "<group-first-key>:true\n" when the queue sets one
    # client mode: (delivery id, msg id) in delivery order, for cumulative acks
    outstanding: deque[tuple[int, int]] = field(default_factory=deque)

    @classmethod
    def of(
        cls,
        sub_id: str,
        mode: str,
        stream: ConsumerStream,
        version: str | None,
        esc_key: Callable[[str], str],
        esc_value: Callable[[str], str],
    ) -> Subscription:
        """The subscription of a new consumer's stream; what each MESSAGE repeats is rendered
        here once, escaped as the connection's STOMP version wants."""
        first_key = stream.first_key
        return cls(
            id=sub_id,
            consumer_id=stream.consumer_id,
            queue=stream.queue,
            mode=MODES[mode],
            stream=stream,
            head=f"MESSAGE\nsubscription:{esc_value(sub_id)}\n",
            ack_prefix=(
                f"ack:{stream.consumer_id}/" if version == "1.2" and mode != "auto" else None
            ),
            first_line=f"{esc_key(first_key)}:true\n" if first_key else None,
        )

    def take_upto(self, delivery_id: int) -> list[tuple[int, int]]:
        """Cumulative ack: every outstanding delivery up to and including `delivery_id`."""
        out = []
        outstanding = self.outstanding
        while outstanding and outstanding[0][0] <= delivery_id:
            out.append(outstanding.popleft())
        return out


@dataclass(slots=True)
class Settle:
    sub: Subscription
    delivery_id: int
    msg_id: int | None
    kind: str  # "ack", "release" or "reject"


@dataclass(slots=True)
class Transaction:
    ops: list[Outgoing | Settle] = field(default_factory=list)
    size: int = 0


class Transactions:
    """A connection's open transactions and the bytes they buffer, within the limits."""

    def __init__(self, max_ops: int, held: Meter | None = None) -> None:
        self._open: dict[str, Transaction] = {}
        self._bytes = 0
        self.max_ops = max_ops  # frames one transaction may hold (limits.max-batch-messages)
        self._held = held if held is not None else Meter()  # the node's memory: counted there

    def begin(self, tx: str) -> None:
        if tx in self._open:
            raise ProtocolError(f"transaction {tx!r} has already begun")
        if len(self._open) >= MAX_TRANSACTIONS:
            raise ProtocolError(f"more than {MAX_TRANSACTIONS} open transactions")
        self._open[tx] = Transaction()

    def buffer(self, tx: str, op: Outgoing | Settle, size: int) -> None:
        t = self._open.get(tx)
        if t is None:
            raise ProtocolError(f"no transaction {tx!r} on this connection")
        if len(t.ops) >= self.max_ops:
            raise ProtocolError(
                f"transaction {tx!r} holds {self.max_ops} frames, the limit "
                "(limits.max-batch-messages)"
            )
        if self._bytes + size > MAX_TRANSACTION_BYTES:
            raise ProtocolError(
                f"transactions hold more than {MAX_TRANSACTION_BYTES} bytes of messages"
            )
        t.ops.append(op)
        t.size += size
        self._bytes += size
        self._held.add(size)

    def pop(self, tx: str) -> Transaction:
        t = self._open.pop(tx, None)
        if t is None:
            raise ProtocolError(f"no transaction {tx!r} on this connection")
        self._bytes -= t.size
        self._held.add(-t.size)
        return t

    def clear(self) -> None:
        self._open.clear()
        self._held.add(-self._bytes)
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._open)


def ack_target(
    frame: Frame,
    version: str | None,
    session_id: str,
    by_consumer: Mapping[str, Subscription],
    by_msg_id: Mapping[int, tuple[Subscription, int]],
) -> tuple[Subscription, int, int | None] | None:
    """The delivery an ACK/NACK names; None when its subscription is gone (a no-op).

    STOMP 1.2 names it by the MESSAGE's `ack` id (`CONSUMER/DELIVERY`), 1.0 and 1.1 by its
    `message-id`.
    """
    if version == "1.2":
        key = required(frame, "id")
        consumer_id, sep, raw = key.rpartition("/")
        if not (sep and raw.isascii() and raw.isdigit()):
            raise ProtocolError(f"unknown ack id {key[:100]!r}")
        sub = by_consumer.get(consumer_id)
        if sub is None:
            if consumer_id.startswith(f"{session_id}-"):
                return None  # unsubscribed: its messages went back to the queue
            raise ProtocolError(f"ack id {key[:100]!r} is not from this connection")
        return sub, int(raw), None
    raw = frame.headers.get("message-id")
    if raw is None:
        raise ProtocolError(f"{frame.command} frame requires a 'message-id' header")
    try:
        msg_id = int(raw)
    except ValueError:
        raise ProtocolError(f"unknown message-id {raw[:100]!r}") from None
    found = by_msg_id.get(msg_id)
    if found is None:
        return None  # acknowledged already (or never delivered here)
    return found[0], found[1], msg_id
