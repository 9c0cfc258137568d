"""gRPC options every pinmq connection shares: keepalive pings and bounded reconnect backoff.

A node or peer that stops answering without closing its sockets (SIGSTOP, a hung host, a cut
cable) is only noticed by HTTP/2 keepalive pings: when a ping gets no answer within the
interval the transport closes and every call on it fails with UNAVAILABLE. In grpcio 1.85 it
is `grpc.http2.ping_timeout_ms` that bounds this wait (with `keepalive_timeout_ms` alone a
frozen peer went unnoticed for 15 s when measured). Reconnects back off at most
RECONNECT_MAX_MS, so a node that returns is reachable again within about a second instead of
after gRPC's default backoff (up to two minutes, 13 s measured after a 30 s outage).

A peer's name can move to another address (a container reconnected to its network gets a
fresh IP, and its old one may go to another container): every channel resolves its target
again at most RESOLVE_MIN_MS after the last time, not gRPC's default 30 s, during which a
channel kept dialling the old address (measured: 25 s of calls answered by the container that
took it over, or refused by TLS when its certificate names another node).
"""

from __future__ import annotations

import grpc
from grpc import aio

from broker.tls import TlsFiles

KEEPALIVE_MS = 2000  # a silent peer is noticed within two of these
# Trailing metadata of a call the node itself refused: its answer, not a lost connection.
REFUSED_METADATA = ("pinmq-refused", "1")
RECONNECT_MAX_MS = 1000
RESOLVE_MIN_MS = 500

Options = list[tuple[str, int]]


def _pings(interval_ms: int) -> Options:
    """Ping every `interval_ms`, even with no call open, and give up after as long again."""
    return [
        ("grpc.keepalive_time_ms", interval_ms),
        ("grpc.keepalive_timeout_ms", interval_ms),
        ("grpc.http2.ping_timeout_ms", interval_ms),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def keepalive(interval_ms: int = KEEPALIVE_MS) -> Options:
    """A channel pings its server every `interval_ms` and gives up after as long again."""
    return [*_pings(interval_ms), ("grpc.http2.max_pings_without_data", 0)]


def reconnect(max_backoff_ms: int = RECONNECT_MAX_MS) -> Options:
    """Reconnect attempts start after 100 ms and back off to at most `max_backoff_ms`."""
    return [
        ("grpc.initial_reconnect_backoff_ms", min(100, max_backoff_ms)),
        ("grpc.min_reconnect_backoff_ms", min(100, max_backoff_ms)),
        ("grpc.max_reconnect_backoff_ms", max_backoff_ms),
    ]


def serve_keepalive(interval_ms: int = KEEPALIVE_MS) -> Options:
    """A server that pings its clients as `keepalive` does, and accepts their pings."""
    return [
        *_pings(interval_ms),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", interval_ms // 2),
        ("grpc.http2.max_ping_strikes", 0),
    ]


def dial(address: str, options: Options, tls: TlsFiles | None) -> aio.Channel:
    """A channel to `address`: over TLS, verifying the server against `tls.ca` (and
    presenting `tls.cert` when given), or in plain text when `tls` is None. Its target's
    name is resolved again within RESOLVE_MIN_MS once a connection to it fails."""
    options = [*options, ("grpc.dns_min_time_between_resolutions_ms", RESOLVE_MIN_MS)]
    if tls is None:
        return aio.insecure_channel(address, options=options)
    return aio.secure_channel(address, tls.channel_credentials(), options=options)


def dial_blocking(address: str, tls: TlsFiles | None) -> grpc.Channel:
    """`dial` for blocking code (a launcher's or a test's health checks), with `reconnect`'s
    bounded backoff: a check that began before the node listened tries again within a
    second, not after gRPC's default backoff (a node listening 17 s after its start under
    CI's load was first tried again 26 s after it, past a 20 s start timeout)."""
    options = reconnect()
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls.channel_credentials(), options=options)


def listen(server: aio.Server, address: str, tls: TlsFiles | None, client_cert: bool) -> None:
    """Bind `server` to `address`: over TLS presenting `tls.cert` (and requiring a client
    certificate issued by `tls.ca` when `client_cert`), or in plain text when `tls` is None.
    RuntimeError when the address cannot be bound, as grpc raises it."""
    if tls is None:
        server.add_insecure_port(address)
    else:
        server.add_secure_port(address, tls.server_credentials(client_cert))


def peer_of(context: aio.ServicerContext) -> str:
    """A call's caller as `host:port` (grpc says `ipv4:host:port`), as the STOMP and HTTP
    listeners name theirs."""
    peer = context.peer()
    scheme, colon, rest = peer.partition(":")
    return rest if colon and scheme in ("ipv4", "ipv6") else peer
