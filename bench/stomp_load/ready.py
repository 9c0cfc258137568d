"""Whether a STOMP server answers: the readiness wait of every broker the benchmark starts."""

from __future__ import annotations

import socket
import subprocess
import time
from contextlib import suppress
from pathlib import Path

from harness.procs import tail


def stomp_answers(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether a STOMP server at host:port answers CONNECT with CONNECTED."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
            data = b""
            deadline = time.monotonic() + timeout
            while b"\x00" not in data and time.monotonic() < deadline:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            ok = data.lstrip(b"\r\n").startswith(b"CONNECTED")
            with suppress(OSError):
                s.sendall(b"DISCONNECT\n\n\x00")
            return ok
    except OSError:
        return False


def wait_stomp(
    host: str, port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float, what: str
) -> float:
    """Poll until the STOMP port answers; return seconds waited. Raise if `proc` dies / timeout."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{tail(log)}")
        if stomp_answers(host, port, timeout=1.0):
            return time.monotonic() - t0
        time.sleep(0.1)
    raise RuntimeError(f"{what}: STOMP not answering after {timeout:.0f} s:\n{tail(log)}")
