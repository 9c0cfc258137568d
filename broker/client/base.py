"""What the client's parts share: message types, defaults, the channel's readiness, and `Link`.

`Link` is what a producer or consumer needs of the connection that made it, so neither
imports `Client` (which creates them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Literal, Protocol, TypeVar

import grpc
from grpc import aio

from broker import channels
from broker.audit import AuditLog
from pinmq_pb import client_pb2_grpc as pb_grpc

Body = bytes | str
Item = Body | tuple[Body, Mapping[str, str]]
SettleKind = Literal["ack", "release", "reject"]
T = TypeVar("T")

DEFAULT_URL = "127.0.0.1:7601"
CONNECT_TIMEOUT_S = 5.0
CALL_TIMEOUT_S = 30.0  # every request's deadline, unless the Client is given another
# How long a client with several addresses keeps looking for one that answers after its
# connection dropped: long enough for a backup to take over from its live node.
FAILOVER_TIMEOUT_S = 30.0
BATCH_BYTES = 1 << 20  # a send_many batch is cut at this size, below the server's frame limit
# A frozen node fails the calls on it within two keepalive intervals; a node that returns is
# reached again within about a second (broker/channels.py).
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    *channels.keepalive(),
    *channels.reconnect(),
]


class Link(Protocol):
    """The connection a producer or consumer works through (`Client`)."""

    target: str  # the node it is connected to (host:port)
    generation: int  # grows by one with every (re)connection: a call knows which link it used
    audit: AuditLog | None
    call_timeout: float  # seconds a request may take before its outcome counts as unknown
    _broker: pb_grpc.BrokerStub
    metadata: tuple[tuple[str, str], ...]  # every call's: the client's credentials, if any
    user: str | None  # the user it authenticates as (in its audit events)

    @property
    def fails_over(self) -> bool: ...

    async def _move(self, generation: int) -> None: ...

    async def _with_failover(
        self, attempt: Callable[[], Awaitable[T]], *, repeat_unknown: bool
    ) -> T: ...

    def _blocked(self) -> None: ...


async def ready(channel: aio.Channel, timeout: float) -> bool:
    """Wait until the channel connects; False at once on a refused connection, or on timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    state = channel.get_state(try_to_connect=True)
    # A failure at the very first look is not this channel's: it shares the process's
    # connection to that address, which another client left in its reconnect backoff (at most
    # RECONNECT_MAX_MS). Wait for that attempt instead of failing a node that is back.
    inherited = state == grpc.ChannelConnectivity.TRANSIENT_FAILURE
    while state != grpc.ChannelConnectivity.READY:
        remaining = deadline - loop.time()
        failed = state == grpc.ChannelConnectivity.TRANSIENT_FAILURE and not inherited
        if failed or remaining <= 0:
            return False
        inherited = False
        try:
            async with asyncio.timeout(remaining):
                await channel.wait_for_state_change(state)
        except TimeoutError:
            return False
        state = channel.get_state(try_to_connect=True)
    return True
