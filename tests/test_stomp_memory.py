"""What a STOMP connection holds goes when it ends, and a started frame must finish in time.

Connections that park most of a large frame and then close, in rounds, must not leave the
node's memory at the sum of the rounds (their buffers sat in reference cycles until the cycle
collector ran). A frame that stops half-way is cut off after `stomp.frame-timeout-ms`, even
with heart-beats off.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import NodeProcess
from stomp_helpers import Raw

from pinmq.stomp.frames import encode_frame

FRAME = 4 * 1024 * 1024
PARKED = 3 * 1024 * 1024  # of each frame, sent before the socket closes
SOCKETS = 30
ROUNDS = 3


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    stomp = {"max-frame-size": FRAME + 4096, "frame-timeout-ms": 20_000, "heart-beat-ms": 0}
    node = NodeProcess(tmp_path, {"stomp": stomp, "limits": {"max-message-size": FRAME}})
    node.start()
    yield node
    node.kill()


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _settle(pid: int) -> float:
    """RSS once it stops falling (the node frees a closed connection's buffers at once)."""
    last = _rss_mib(pid)
    for _ in range(20):
        time.sleep(0.1)
        now = _rss_mib(pid)
        if abs(now - last) < 1:
            return now
        last = now
    return last


def test_memory_of_closed_connections_with_parked_frames_returns(node: NodeProcess) -> None:
    assert node.proc is not None
    pid = node.proc.pid
    start = _settle(pid)
    head = f"SEND\ndestination:/queue/parked\ncontent-length:{FRAME}\n\n".encode()
    peaks, after = [], []
    for _ in range(ROUNDS):
        socks = []
        for _ in range(SOCKETS):
            r = Raw(node.stomp_port)
            r.connect()
            r.send(head + b"x" * PARKED)
            socks.append(r)
        peaks.append(_settle(pid))  # every connection holds its part of a frame
        for r in socks:
            r.close()
        time.sleep(0.3)
        after.append(_settle(pid))
    held = SOCKETS * PARKED / 2**20
    assert min(peaks) > start + held / 2, (start, peaks)  # the rounds did park their frames
    # Without the buffers released on close, RSS grew by about `held` per round (and with
    # glibc's moving mmap threshold it stayed at the peak after the first round).
    assert max(after) < start + held / 3, (start, peaks, after)


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
