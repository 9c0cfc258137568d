"""Process plumbing for benchmarks: ports, start and stop, CPU readings, waits on workers."""

from __future__ import annotations

import asyncio
import ctypes
import os
import queue as queue_mod
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from types import FrameType
from typing import IO, Any, NamedTuple, NoReturn, TypeVar

# The test suite's port reservation (below the ephemeral range, locked against other runs):
# a benchmark beside a test run, or beside another benchmark, never takes one of their ports.
sys.path.append(str(Path(__file__).resolve().parents[2] / "tests"))
from ports import reserve_port

__all__ = ["reserve_port"]

CLK_TCK = os.sysconf("SC_CLK_TCK")

# Sets PR_SET_PDEATHSIG, then execs the command: the setting survives exec, and no preexec_fn
# is needed (with one, Python must fork(), and gRPC's fork handlers complain about our threads).
_DIE_WITH_PARENT_EXEC = (
    "import ctypes, os, sys; ctypes.CDLL(None).prctl(1, 15); os.execvp(sys.argv[1], sys.argv[1:])"
)


def rss_mib(pid: int) -> float:
    """Resident set size of a process, MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies (best effort)."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(
    command: Sequence[str], log: IO[bytes], cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """`command` with output to `log`, in a session of its own, SIGTERMed by Linux if we die."""
    return subprocess.Popen(
        [sys.executable, "-c", _DIE_WITH_PARENT_EXEC, *command],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,  # Ctrl-C reaches only us; we stop our children ourselves
    )


def stop(*procs: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM every one of `procs` at once, then SIGKILL any not gone after `grace` seconds."""
    for proc in procs:
        if proc.poll() is None:
            with suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    for proc in procs:
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


def run_main(body: Callable[[], bool | int]) -> NoReturn:
    """Run a benchmark's body, SIGTERM acting as Ctrl-C, and exit with its outcome.

    True -> 0, False -> 1, an int -> itself; 130 when interrupted (SIGTERM too, so that
    every `finally` runs and every process the body started is stopped).
    """

    def on_term(_sig: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    try:
        outcome = body()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit((0 if outcome else 1) if isinstance(outcome, bool) else outcome)


# ---- CPU ------------------------------------------------------------------------------------


def _stat_cpu(path: str) -> tuple[str, float]:
    """(comm, user + system CPU seconds) from a /proc/.../stat file."""
    with open(path, "rb") as f:
        head, rest = f.read().rsplit(b")", 1)
    fields = rest.split()
    comm = head.split(b"(", 1)[1].decode(errors="replace")
    return comm, (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process so far, all its threads (0 if it is gone)."""
    try:
        return _stat_cpu(f"/proc/{pid}/stat")[1]
    except OSError:
        return 0.0


class NodeCpu(NamedTuple):
    """CPU seconds of a node process; the rest (total - loop - grpc) is the writer threads."""

    total: float
    loop: float  # the main thread: the event loop
    grpc: float  # gRPC's C-core threads (not named python*)


def node_cpu(pid: int) -> NodeCpu:
    """A node's CPU seconds so far, split by thread kind (zeros if it is gone)."""
    total = proc_cpu(pid)
    loop = grpc_core = 0.0
    with suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with suppress(OSError):
                comm, cpu = _stat_cpu(f"/proc/{pid}/task/{tid}/stat")
                if int(tid) == pid:
                    loop = cpu
                elif not comm.startswith("python"):
                    grpc_core += cpu
    return NodeCpu(total, loop, grpc_core)


class MachineCpu(NamedTuple):
    """Whole-machine CPU seconds since boot."""

    busy: float  # user, nice, system, irq, softirq
    iowait: float
    steal: float  # taken by the hypervisor


IDLE = MachineCpu(0.0, 0.0, 0.0)
Reading = TypeVar("Reading", NodeCpu, MachineCpu)


def used(after: Reading, before: Reading) -> Reading:
    """The CPU seconds spent between two readings, field by field."""
    return type(after)(*(a - b for a, b in zip(after, before, strict=True)))


def machine_cpu() -> MachineCpu:
    with open("/proc/stat") as f:
        user, nice, system, _idle, iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    busy = user + nice + system + irq + softirq
    return MachineCpu(busy / CLK_TCK, iowait / CLK_TCK, steal / CLK_TCK)


def fsync_ms(directory: Path, rounds: int = 20) -> tuple[float, float]:
    """p50 and p99 of a 4 KiB append + fsync in `directory` (ms): the disk's state right now.

    A durable send or decision is such a commit at heart, so its tail follows this one on a
    disk shared with other work.
    """
    probe = directory / "fsync-probe"
    times = []
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(rounds):
            t = time.perf_counter()
            os.write(fd, bytes(4096))
            os.fsync(fd)
            times.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        probe.unlink()
    times.sort()
    return times[rounds // 2] * 1000, times[min(rounds - 1, rounds * 99 // 100)] * 1000


# ---- worker processes -----------------------------------------------------------------------


def poll_event(events: Any, procs: Sequence[Any], deadline: float) -> tuple[str, Any] | None:
    """The next (kind, payload) from worker processes within 0.2 s, else None.

    Short waits, so that Ctrl-C is seen promptly; raises when `deadline` (monotonic) has
    passed or a worker process failed.
    """
    with suppress(queue_mod.Empty):
        return events.get(True, 0.2)  # type: ignore[no-any-return]
    if time.monotonic() > deadline:
        raise TimeoutError("no word from the client processes in time")
    if any(p.exitcode not in (None, 0) for p in procs):
        raise RuntimeError("a client process failed (see its traceback above)")
    return None


def end_workers(procs: Sequence[Any], events: Any) -> None:
    """Terminate the worker processes still running and close their event queue."""
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(5)
    events.close()


def next_event(events: Any, procs: Sequence[Any], timeout: float) -> tuple[str, Any]:
    """The next event from worker processes, waiting at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (event := poll_event(events, procs, deadline)) is None:
        pass
    return event


async def next_event_async(events: Any, procs: Sequence[Any], timeout: float) -> tuple[str, Any]:
    """next_event for a coroutine: each short wait in a thread, the loop free meanwhile."""
    deadline = time.monotonic() + timeout
    while (event := await asyncio.to_thread(poll_event, events, procs, deadline)) is None:
        pass
    return event
