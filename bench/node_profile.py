"""Where a persistent grouped message's microseconds go in the node: a profile, kept.

Runs the STOMP workload (bench/stomp_vs_activemq.py, pinmq only: 1 and 100 groups, backlog
and concurrent) and the gRPC one (bench/end_to_end.py, 100 groups, persistent) with every node
sampled by py-spy from the moment it serves (bench/harness/profiling.py: not pausing the node,
idle threads left out, so the samples are CPU the node spent). For each workload it writes
under bench/profiles/ (ignored by git) the flame graph (`<node>-<pid>.svg`) and `top.txt`:

- the share of the node's samples, and the microseconds per message it comes to (the share of
  the node's CPU per message the benchmark itself measured), per part of the path: each sample
  goes to the part that holds its innermost frame in pinmq's own code (or, for a sample wholly
  outside it, to the library or runtime at its leaf);
- the same shares of the samples that held the GIL: Python's own work, the event loop's above
  all (a running thread's samples include the store writer's SQLite work and its fsync waits,
  which run beside the loop without the GIL);
- the top 25 functions by own time (the leaf frame of a sample), in both views.

(`bench/profile.py` runs it; this module holds the code under a name that hides nothing.)

Usage: python bench/profile.py [--quick | --messages N] [--only stomp|grpc] [--rate HZ]
       [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from harness.profiling import DIR_ENV, RATE_ENV, py_spy

BENCH = Path(__file__).resolve().parent
OUT = BENCH / "profiles"
WORKLOADS = {
    "stomp": (
        ["stomp_vs_activemq.py", "--only", "pinmq"],
        r"broker [\d.]+ s \([\d.]+ cores, (\d+) us/msg\)",
    ),
    "grpc": (
        ["end_to_end.py", "--groups", "100", "--modes", "persistent"],
        r"node CPU per message\s+(\d+) us",
    ),
}
# The parts of a message's path, by the module of the innermost frame in pinmq's code.
PARTS = (
    ("STOMP frame parsing", ("pinmq/stomp/frames.py", "pinmq/stomp/protocol.py")),
    ("STOMP rendering (deliveries)", ("pinmq/stomp/render.py",)),
    ("STOMP session and connection", ("pinmq/stomp/",)),
    ("gRPC shell (decode, encode, streams)", ("pinmq/grpc_", "broker/streams.py")),
    ("validation", ("broker/validation.py",)),
    ("message records", ("broker/message.py",)),
    ("duplicate ids", ("broker/duplicates.py",)),
    ("memory and disk accounting", ("broker/budget.py", "broker/room.py", "broker/disk.py")),
    ("routing (send path, addresses, grouping)", ("broker/sending.py", "broker/addresses.py")),
    ("routing (send path, addresses, grouping)", ("broker/grouping.py", "broker/wildcard.py")),
    ("cluster and grouping handler", ("cluster/", "handler/")),
    ("dispatch and groups (delivery, acks)", ("broker/dispatch.py", "broker/queue.py")),
    ("dispatch and groups (delivery, acks)", ("broker/group_state.py", "broker/queue_stats.py")),
    ("dispatch and groups (delivery, acks)", ("broker/lagging.py", "broker/paging.py")),
    ("engine and core (commands, effects)", ("broker/engine.py", "broker/core.py")),
    ("engine and core (commands, effects)", ("broker/unit.py", "broker/effects.py")),
    ("store writes (sends, acks, delivery counts)", ("broker/store", "broker/writes.py")),
    ("store writes (sends, acks, delivery counts)", ("broker/sqlite_file.py",)),
    ("audit hooks", ("broker/audit",)),
    ("logging", ("broker/logs.py", "structlog/")),
)
OUTSIDE = (  # a sample with no frame of pinmq's: where its leaf is
    ("gRPC library and protobuf", ("grpc/", "google/protobuf")),
    ("asyncio event loop and sockets", ("asyncio/", "selectors.py", "ssl.py", "socket.py")),
    ("threads (store writer, audit, gRPC) outside pinmq's code", ("threading.py",)),
    ("logging", ("structlog/", "logging/")),
)
OWN_CODE = ("pinmq/", "broker/", "cluster/", "handler/")
ENTRY = ("pinmq/cli.py", "pinmq/process.py")  # below every frame: no part of the path
FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*):\d+\)$")
TOP = 25
TOP_RUNNING = f"top {TOP} functions by own time (running threads):"
TOP_GIL = f"top {TOP} functions by own time holding the GIL (Python's own work):"


def frames(line: str) -> tuple[list[tuple[str, str]], int]:
    """A raw py-spy line: its frames (function, file), outermost first, and its sample count."""
    stack, _, count = line.rpartition(" ")
    parsed = []
    for part in stack.split(";")[1:]:  # the first is the thread
        m = FRAME.match(part)
        if m is not None:
            parsed.append((m["func"], _relative(m["file"])))
    return parsed, int(count)


def _relative(file: str) -> str:
    """A frame's file as a path from the repository or site-packages."""
    for marker in ("site-packages/", "lib/python3."):
        if marker in file:
            file = file.split(marker, 1)[1]
            return file.split("/", 1)[1] if marker == "lib/python3." else file
    return file


def part_of(stack: list[tuple[str, str]]) -> str:
    for _, file in reversed(stack):
        if file.startswith(OWN_CODE) and not file.startswith(ENTRY):
            for name, prefixes in PARTS:
                if file.startswith(prefixes):
                    return name
            return f"other pinmq code ({file})"
    leaf = stack[-1][1] if stack else ""
    for name, prefixes in OUTSIDE:
        if any(p in leaf for p in prefixes):
            return name
    return "other (runtime, libraries)"


def rank(lines: Iterable[str]) -> tuple[Counter[str], Counter[str], int]:
    """Samples per part, per leaf function, and in all."""
    parts: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = 0
    for line in lines:
        if not line.strip():
            continue
        stack, count = frames(line)
        if not stack:
            continue
        total += count
        parts[part_of(stack)] += count
        func, file = stack[-1]
        leaves[f"{func} ({file})"] += count
    return parts, leaves, total


def _lines(directory: Path, suffix: str) -> list[str]:
    lines: list[str] = []
    for raw in sorted(directory.glob(f"*{suffix}")):
        if suffix != ".txt" or not raw.name.endswith(".gil.txt"):
            lines += raw.read_text().splitlines()
    return lines


def report(workload: str, output: str, directory: Path, pattern: str) -> str:
    parts, leaves, total = rank(_lines(directory, ".txt"))
    gil_parts, gil_leaves, gil_total = rank(_lines(directory, ".gil.txt"))
    if not total or not gil_total:
        return f"{workload}: no samples (is py-spy allowed to read the node? see its .log files)"
    per_msg = [int(x) for x in re.findall(pattern, output)]
    us = sum(per_msg) / len(per_msg) if per_msg else 0.0
    text = [
        f"== {workload}: {total:,} samples of running threads, {gil_total:,} of the GIL's "
        f"holder; node CPU per message {us:.0f} us (the benchmark's mean over {len(per_msg)} "
        "scenario(s)) ==",
        f"{'part of the path':<46}{'share':>7}{'us/msg':>8}{'GIL share':>10}",
    ]
    for name in sorted(parts.keys() | gil_parts.keys(), key=lambda k: -parts[k]):
        n = parts[name]
        text.append(
            f"{name[:45]:<46}{n / total:>7.1%}{us * n / total:>8.1f}"
            f"{gil_parts[name] / gil_total:>10.1%}"
        )
    for title, counts, of in ((TOP_RUNNING, leaves, total), (TOP_GIL, gil_leaves, gil_total)):
        text += ["", title, f"{'share':>6}  function (file)"]
        for name, n in counts.most_common(TOP):
            text.append(f"{n / of:>6.1%}  {name}")
    return "\n".join(text)


def run(workload: str, args: argparse.Namespace) -> str:
    script, pattern = WORKLOADS[workload]
    directory = args.out / workload
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.iterdir():
        old.unlink()
    size = (
        ["--quick"] if args.quick else ["--messages", str(args.messages)] if args.messages else []
    )
    env = {**os.environ, DIR_ENV: str(directory), RATE_ENV: str(args.rate)}
    command = [sys.executable, str(BENCH / script[0]), *script[1:], *size]
    print(f"-- {workload}: {' '.join(command[1:])} (nodes sampled at {args.rate} Hz)", flush=True)
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"{script[0]} failed with exit code {done.returncode}")
    text = report(workload, done.stdout, directory, pattern)
    (directory / "top.txt").write_text(text + "\n")
    flames = ", ".join(str(p) for p in sorted(directory.glob("*.svg")))
    return f"{text}\nflame graph: {flames}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="each benchmark's --quick size")
    size.add_argument("--messages", type=int, metavar="N", help="messages per scenario")
    parser.add_argument("--only", choices=sorted(WORKLOADS), help="one workload only")
    parser.add_argument("--rate", type=int, default=100, help="samples per second (default 100)")
    parser.add_argument("--out", type=Path, default=OUT, help="where (default bench/profiles)")
    args = parser.parse_args()
    py_spy()  # missing: say so before any benchmark runs
    reports = [run(w, args) for w in ([args.only] if args.only else list(WORKLOADS))]
    print("\n" + "\n".join(reports))


if __name__ == "__main__":
    main()
