"""Memory a STOMP connection no longer needs: RSS of a node across rounds of parked frames.

One `pinmq node` (bench/harness). Each round opens `--sockets` STOMP connections that send
CONNECT and then most of one large SEND frame (`--parked` MiB of a frame of `--frame` MiB),
then closes them all. Printed per round: the node's RSS at its start, with every frame
parked, and after the connections closed. The node should come back near where the round
began (the report had 0.1 -> 2.1 -> 4.0 -> 4.9 GB over three rounds of 200 x 9.5 MiB).
No threshold is asserted; the node is stopped on exit, error, Ctrl-C or SIGTERM.

Usage: python bench/connection_memory.py [--rounds R] [--sockets N] [--parked MIB] [--frame MIB]
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import time
from pathlib import Path

from harness.nodes import running_node
from harness.procs import rss_mib, run_main

from pinmq.stomp.frames import encode_frame

MIB = 1 << 20


def settled(pid: int) -> float:
    """RSS once it stops moving (by less than 1 MiB in 100 ms)."""
    last = rss_mib(pid)
    for _ in range(50):
        time.sleep(0.1)
        now = rss_mib(pid)
        if abs(now - last) < 1:
            return now
        last = now
    return last


def crossed(pid: int, mib: float, upward: bool, timeout_s: float = 20.0) -> None:
    """Wait (bounded) until RSS is above `mib` (`upward`) or below it: the node has begun to
    take the parked frames in, or to free them. On a loaded machine it may get to them later
    than one 100 ms step of `settled`, which would then read too early; a node that never
    does waits it out."""
    deadline = time.monotonic() + timeout_s
    while (rss_mib(pid) > mib) != upward and time.monotonic() < deadline:
        time.sleep(0.1)


def main() -> bool:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sockets", type=int, default=200)
    parser.add_argument("--parked", type=float, default=9.5, help="MiB sent of each frame")
    parser.add_argument("--frame", type=float, default=10.0, help="MiB the frame announces")
    args = parser.parse_args()
    frame, parked = int(args.frame * MIB), int(args.parked * MIB)
    stomp = {"max-frame-size": frame + 4096, "heart-beat-ms": 0, "listen-backlog": 4096}
    extra = {"stomp": stomp, "limits": {"max-message-size": frame}}
    head = f"SEND\ndestination:/queue/parked\ncontent-length:{frame}\n\n".encode()
    connect = encode_frame("CONNECT", {"accept-version": "1.2", "host": "x"}, b"")
    with (
        tempfile.TemporaryDirectory(prefix="pinmq-conn-mem-") as tmp,
        running_node(Path(tmp), extra) as node,
    ):
        port = int(node.listen["stomp"].rpartition(":")[2])
        print(f"{args.rounds} rounds of {args.sockets} connections x {args.parked} MiB parked")
        print(f"{'round':>5} {'start MiB':>10} {'parked MiB':>11} {'after MiB':>10}")
        for i in range(1, args.rounds + 1):
            start = settled(node.pid)
            socks = []
            for _ in range(args.sockets):
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(connect + head + b"x" * parked)
                socks.append(s)
            crossed(node.pid, start + args.sockets * args.parked / 2, upward=True)
            peak = settled(node.pid)
            for s in socks:
                s.close()
            crossed(node.pid, peak - (peak - start) / 2, upward=False)
            after = settled(node.pid)
            print(f"{i:5d} {start:10.0f} {peak:11.0f} {after:10.0f}", flush=True)
    return True


if __name__ == "__main__":
    run_main(main)
