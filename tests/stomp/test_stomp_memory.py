"""What a STOMP connection holds goes when it ends, and a started frame must finish in time.

Connections that park most of a large frame and then close, in rounds, must not leave the
node's memory at the sum of the rounds (their buffers sat in reference cycles until the cycle
collector ran). A frame that stops half-way is cut off after `stomp.frame-timeout-ms`, even
with heart-beats off.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, NodeProcess
from stomp_helpers import Raw

from pinmq.stomp.frames import encode_frame

BENCH = REPO / "bench"
SOCKETS, PARKED_MIB = 30, 3


def test_memory_of_closed_connections_with_parked_frames_returns() -> None:
    """bench/connection_memory.py on a small size; its table is read back."""
    done = subprocess.run(
        [sys.executable, str(BENCH / "connection_memory.py"), "--rounds", "3",
         "--sockets", str(SOCKETS), "--parked", str(PARKED_MIB), "--frame", "4"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    rounds = [[float(x) for x in row[1:]] for row in rows if len(row) == 4 and row[0].isdigit()]
    assert len(rounds) == 3, done.stdout
    start = rounds[0][0]
    held = SOCKETS * PARKED_MIB
    assert min(peak for _, peak, _ in rounds) > start + held / 2, done.stdout  # they parked
    # Without the buffers released on close, RSS grew by about `held` per round (and with
    # glibc's moving mmap threshold it stayed at the peak after the first round).
    assert max(after for _, _, after in rounds) < start + held / 3, done.stdout


def test_a_frame_that_stops_half_way_is_cut_off(tmp_path: Path) -> None:
    stomp = {"frame-timeout-ms": 300, "heart-beat-ms": 0}
    node = NodeProcess(tmp_path, {"stomp": stomp}).start()
    try:
        r = Raw(node.stomp_port)
        r.connect(**{"heart-beat": "0,0"})
        began = time.monotonic()
        r.send(encode_frame("SEND", {"destination": "/queue/slow"}, b"abc")[:-5])  # no NUL
        error = r.frame()
        waited = time.monotonic() - began
        assert error.command == "ERROR"
        assert "frame not completed within 300 ms" in error.headers["message"]
        assert waited >= 0.3
        r.close()
    finally:
        node.kill()
