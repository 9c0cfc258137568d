"""Small process and socket helpers shared by the STOMP benchmark modules."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from contextlib import suppress
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies (best effort)."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process `pid` (all its threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def stop(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM `proc`, then SIGKILL it if it has not exited after `grace` seconds."""
    if proc.poll() is None:
        with suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                proc.kill()
            proc.wait(10)


def tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file ('' when missing)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def machine_cpu() -> tuple[float, float]:
    """CPU seconds the whole machine has spent busy, and stolen by the hypervisor, since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / CLK_TCK, steal / CLK_TCK
