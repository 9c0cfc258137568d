"""Part 3 of bench/security.py: connection set-up, median and p99 of sequential connects.

gRPC: `Client.connect` (the channel ready: TCP, TLS, HTTP/2) plus the first call, which
carries the password check (argon2id the first time the node verifies that password, a keyed
digest of it after that: the figures are a returning user's); STOMP: the TCP connect through the
TLS handshake, then CONNECT (with login and passcode) to CONNECTED, over a bare socket.
"""

from __future__ import annotations

import socket
import ssl
import statistics
import time
from dataclasses import dataclass, field

from harness.stats import pct

from security_parts.variants import LABEL, VARIANTS, Variant, ratio_text, rotation

STOMP_TIMEOUT_S = 180.0  # a wrong passcode queued behind a host's argon2 checks waits long


def stomp_connect(
    host: str,
    port: int,
    context: ssl.SSLContext | None,
    login: tuple[str, str] | None,
    timeout: float = STOMP_TIMEOUT_S,
) -> tuple[float, float, str]:
    """Connect (TLS when `context`), CONNECT, read the answer: (seconds to connect including
    the TLS handshake, seconds from CONNECT to the answer, the answer's command or "closed")."""
    t0 = time.perf_counter()
    sock: socket.socket = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname=host)  # the handshake, now
        t1 = time.perf_counter()
        headers = f"accept-version:1.2\nhost:{host}\n"
        if login is not None:
            headers += f"login:{login[0]}\npasscode:{login[1]}\n"
        sock.sendall(f"CONNECT\n{headers}\n\x00".encode())
        data = b""
        while b"\x00" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        t2 = time.perf_counter()
        command = data.lstrip(b"\r\n").split(b"\n", 1)[0].decode(errors="replace") or "closed"
        if command == "CONNECTED":
            sock.sendall(b"DISCONNECT\n\n\x00")
    finally:
        sock.close()
    return t1 - t0, t2 - t1, command


@dataclass(slots=True)
class Setup:
    """Sequential connection set-ups of one kind: (connect s, first answer s) each."""

    times: list[tuple[float, float]] = field(default_factory=list)

    def total_ms(self, q: float) -> float:
        return pct(sorted(a + b for a, b in self.times), q) * 1e3

    def part_ms(self, i: int) -> float:
        return statistics.median(t[i] for t in self.times) * 1e3


async def grpc_setup(variant: Variant) -> tuple[float, float]:
    """A new Client: connect (the channel ready: TCP, TLS, HTTP/2), then its first call."""
    client = variant.node.client()
    t0 = time.perf_counter()
    try:
        await client.connect()
        t1 = time.perf_counter()
        await client.queues()
        t2 = time.perf_counter()
    finally:
        await client.close()
    return t1 - t0, t2 - t1


async def setup_times(variants: dict[str, Variant], count: int) -> dict[str, Setup]:
    """`count` gRPC and STOMP set-ups per variant, in rounds of 5 that alternate variants."""
    out = {f"{p} {v}": Setup() for p in ("gRPC", "STOMP") for v in VARIANTS}
    for r in range(-(-count // 5)):
        for v in rotation(r):
            variant = variants[v]
            for _ in range(min(5, count - 5 * r)):
                out[f"gRPC {v}"].times.append(await grpc_setup(variant))
                login = variant.node.reach.login()
                a, b, answer = stomp_connect(*variant.stomp, variant.context, login)
                if answer != "CONNECTED":
                    raise RuntimeError(f"STOMP {v}: CONNECT answered {answer}")
                out[f"STOMP {v}"].times.append((a, b))
    return out


def print_setups(count: int, setups: dict[str, Setup]) -> None:
    """The summary's set-up table: per protocol and variant, in ms."""
    print(f"\nconnection set-up, {count} sequential each (ms)")
    print(
        f"{'':<6}{'variant':<16}{'connect':>8}{'answer':>8}{'total p50':>10}{'p99':>8}"
        f"{'ratio p50':>10}"
    )
    for proto in ("gRPC", "STOMP"):
        base = setups[f"{proto} plain"].total_ms(0.5)
        for v in VARIANTS:
            s = setups[f"{proto} {v}"]
            p50 = s.total_ms(0.5)
            print(
                f"{proto:<6}{LABEL[v]:<16}{s.part_ms(0):>8.1f}{s.part_ms(1):>8.1f}{p50:>10.1f}"
                f"{s.total_ms(0.99):>8.1f}{ratio_text(p50, base):>10}"
            )
    print(
        "  gRPC: connect = Client.connect (channel ready: TCP, TLS, HTTP/2), answer = the first "
        "call, ListQueues (with security: the password check); STOMP: connect = TCP and TLS "
        "handshake, answer = CONNECT -> CONNECTED (with security: login, passcode)"
    )
