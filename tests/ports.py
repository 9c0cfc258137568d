"""Loopback ports for test nodes, reserved so that concurrent test runs never share one.

Binding port 0, closing the socket and handing the number to a node that binds it later races
with everything else on the machine: the kernel gives the same ephemeral ports to outgoing
connections (every gRPC channel), and a second test run alongside picks ports the same way.
So ports come from below the kernel's ephemeral range, where no outgoing connection takes one,
and each is reserved with a byte-range lock on one shared file, held by this process until it
exits: another test run skips a locked port, and a port some other program listens on fails
the bind check. Nodes bind exactly what they are given and fail loudly when they cannot.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

LOCK_FILE = Path(tempfile.gettempdir()) / "pinmq-test-ports.lock"
LOWEST = 10000

_reserved: set[int] = set()  # byte-range locks are per process: remember our own
_lock_fd: int | None = None  # one descriptor for the process's life: closing any drops its locks


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _fd() -> int:
    global _lock_fd
    if _lock_fd is None:
        _lock_fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    return _lock_fd


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def reserve_port() -> int:
    """A loopback port no other test run (and no listener now) uses, kept for this process."""
    high = _ephemeral_low()
    rng = random.Random()
    for _ in range(10_000):
        port = rng.randrange(LOWEST, high)
        if port in _reserved:
            continue
        try:
            fcntl.lockf(_fd(), fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
        except OSError:
            continue  # another test run holds it
        if not _bindable(port):
            fcntl.lockf(_fd(), fcntl.LOCK_UN, 1, port)
            continue
        _reserved.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {LOWEST}..{high}")
