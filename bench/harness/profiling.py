"""py-spy samplers on the nodes a benchmark starts, when bench/profile.py asks for them.

With PINMQ_BENCH_PROFILE set to a directory, every node the harness starts is sampled from
the moment it serves to its exit by three py-spy recorders: a flame graph (SVG), and the raw
collapsed stacks bench/profile.py ranks, of every running thread and of those holding the GIL.
They sample without pausing the node (`--nonblocking`), so its timing is the benchmark's own;
each writes its file when its node exits.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

DIR_ENV = "PINMQ_BENCH_PROFILE"
RATE_ENV = "PINMQ_BENCH_PROFILE_RATE"
# (format, file suffix, extra flags): every running thread, and only those holding the GIL
# (Python's own work; SQLite's and fsync's time in the store writer thread is not).
RECORDINGS = (
    ("flamegraph", "svg", ()),
    ("raw", "txt", ()),
    ("raw", "gil.txt", ("--gil",)),
)
WRITE_TIMEOUT_S = 60.0  # a recorder writes its file once its node is gone


def py_spy() -> str:
    """The py-spy executable (installed with the test extras, next to this Python)."""
    beside = Path(sys.executable).parent / "py-spy"
    found = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    if found is None:
        raise RuntimeError("py-spy is not installed: pip install py-spy")
    return found


def attach(pid: int, name: str) -> list[subprocess.Popen[bytes]]:
    """Recorders on process `pid` (files named `name-pid`), or none without PINMQ_BENCH_PROFILE."""
    out = os.environ.get(DIR_ENV)
    if not out:
        return []
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    rate = os.environ.get(RATE_ENV, "100")
    recorders = []
    for fmt, ext, flags in RECORDINGS:
        path = directory / f"{name}-{pid}.{ext}"
        command = [py_spy(), "record", "--pid", str(pid), "--rate", rate, "--nonblocking"]
        command += ["--threads", *flags, "--format", fmt, "--output", str(path)]
        log = (directory / f"{name}-{pid}.{ext}.log").open("wb")
        recorders.append(subprocess.Popen(command, stdout=log, stderr=log))
    return recorders


def detach(recorders: list[subprocess.Popen[bytes]]) -> None:
    """Wait until each recorder has written its file (its node has exited)."""
    for recorder in recorders:
        try:
            recorder.wait(WRITE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            recorder.terminate()
            recorder.wait(10)
