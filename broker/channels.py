"""gRPC options every pinmq connection shares: keepalive pings and bounded reconnect backoff.

A node or peer that stops answering without closing its sockets (SIGSTOP, a hung host, a cut
cable) is only noticed by HTTP/2 keepalive pings: when a ping gets no answer within the
interval the transport closes and every call on it fails with UNAVAILABLE. In grpcio 1.85 it
is `grpc.http2.ping_timeout_ms` that bounds this wait (with `keepalive_timeout_ms` alone a
frozen peer went unnoticed for 15 s when measured). Reconnects back off at most
RECONNECT_MAX_MS, so a node that returns is reachable again within about a second instead of
after gRPC's default backoff (up to two minutes, 13 s measured after a 30 s outage).
"""

from __future__ import annotations

KEEPALIVE_MS = 2000  # a silent peer is noticed within two of these
# Trailing metadata of a call the node itself refused: its answer, not a lost connection.
REFUSED_METADATA = ("pinmq-refused", "1")
RECONNECT_MAX_MS = 1000

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
