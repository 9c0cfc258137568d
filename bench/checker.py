"""Timings of the PySpark checker (`pinmq check`) on synthetic histories, next to pure Python.

For each size (default 1M and 10M events) the script generates a history once (pipeline/synth:
3 nodes, 10,000 groups (a tenth of the messages if fewer), a failover, ~7 events per message:
routed, sent, client_sent, delivered, client_received, acked, client_acked) into `--dir` (kept
for later runs), then times
- the Spark job on `--master` (default local[2]): checks only, and checks plus statistics
  (what `pinmq check` runs), in one SparkSession started once (its start is printed apart);
  then checks plus statistics with `--cache` (pipeline/cache.py), converting into an empty
  cache and then reusing it; then `pinmq check --cache` reusing it in a process of its own,
  as `make check` runs it (Spark's start and a JVM not yet warmed up included);
- `pipeline/pure.py`: the same five checks in one Python process, one pass over the files.
Every run must find the history clean; the script fails otherwise. The load average is printed
before and after each size: other work on the machine slows the timings down.

With `--audit-cost` it measures the audit log's cost instead: bench/end_to_end.py's grouped
persistent scenario (3 consumers, one producer process, real node process), alternately with
the node's `audit` off and on (the clients do not audit), best of `--repeat` runs each, and
prints the throughput cost, the node's CPU per message, and what the writer thread spends per
event (`AuditLog._lines` on sent, delivered and acked events of 200,000 messages, in this
process).

Usage: python bench/checker.py [--sizes 1000000 10000000] [--dir DIR] [--master URL]
       python bench/checker.py --audit-cost [--repeat 3] [--messages 60000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline import job, pure, synth
from pipeline.spark import session

sys.path.insert(0, str(Path(__file__).parent))

EVENTS_PER_MESSAGE = 7


def own_process(path: Path, cache: Path, master: str) -> float | None:
    """`pinmq check --cache` in a process of its own: its wall time, or None unless it found
    the history clean from the cache it reused."""
    with tempfile.TemporaryDirectory() as report:
        command = ["check", str(path), "--master", master, "--cache", str(cache)]
        t = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pinmq.cli", *command, "--report", report],
            capture_output=True,
            text=True,
        )
        took = time.monotonic() - t
        if done.returncode != 0:
            print(done.stdout + done.stderr, file=sys.stderr)
            return None
        summary = json.loads((Path(report) / "summary.json").read_text())
    return took if summary["input"]["cache"] == "reused" else None


def history(base: Path, events: int) -> Path:
    """The history of about `events` events under `base`, generated unless it is there."""
    out = base / f"history-{events}"
    marker = out / "GENERATED.json"
    if marker.exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    t = time.monotonic()
    messages = events // EVENTS_PER_MESSAGE
    # 10,000 groups, or a tenth of the messages in a small history: synth places each release
    # in a group of its own, away from the failover, which 10,000 groups of 14,000 messages
    # (100,000 events) leave no room for.
    groups = min(10_000, messages // 10)
    made = synth.generate(out, messages=messages, groups=groups, failover=True, releases=100)
    marker.write_text(json.dumps({"events": made.events}))
    print(f"generated {made.events:,} events in {time.monotonic() - t:.1f} s -> {out}")
    return out


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*.jsonl"))


def format_cost(messages: int = 200_000, batch: int = 50) -> tuple[float, float, float]:
    """The writer's µs per event to format, and to join and encode; bytes per event."""
    from collections import deque

    from broker import audit
    from broker.message import GROUP_ID_HEADER
    from broker.queue import Message

    msgs = [
        Message(i, "orders", "orders", b"x", {audit.MID_HEADER: f"bench-p0/{i}",
                GROUP_ID_HEADER: f"g{i % 100}"}, True, 0, f"g{i % 100}", i // 100 + 1)
        for i in range(messages)
    ]  # fmt: skip
    queue: deque[tuple[object, ...]] = deque()
    for k in range(0, messages, batch):  # as `AuditLog.effects` queues one core call's events
        chunk = msgs[k : k + batch]
        queue.append((audit._SENT, 1, tuple(chunk)))
        queue.append((audit._DELIVERED, 2, [(m, f"c{m.msg_id % 3}", 1) for m in chunk]))
        queue.append((audit._ACKED, 3, tuple(chunk)))
    writer = audit.AuditLog(tempfile.mkdtemp(), "bench")
    t = time.perf_counter()
    lines = writer._lines(queue, len(queue))
    t_format = time.perf_counter() - t
    t = time.perf_counter()
    data = "".join(lines).encode()
    t_join = time.perf_counter() - t
    n = len(lines)
    return t_format / n * 1e6, t_join / n * 1e6, len(data) / n


def audit_cost(args: argparse.Namespace) -> int:
    """End-to-end msg/s with the node's audit log off and on (bench/end_to_end.py's scenario)."""
    import asyncio
    import contextlib

    import end_to_end as e2e

    rates: dict[bool, list[float]] = {False: [], True: []}
    cpu_us: dict[bool, list[float]] = {False: [], True: []}  # node CPU per message
    for run in range(args.repeat):
        for on in (False, True):
            print(f"--- run {run + 1}/{args.repeat}, audit {'on' if on else 'off'} ---", flush=True)
            e2e_args = e2e.parser().parse_args(
                ["--messages", str(args.messages), "--groups", "100", "--modes", "persistent"]
                + (["--audit"] if on else [])
            )
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
                _ok, best = asyncio.run(e2e.measure(e2e_args))
            outcome = best[(100, True)]
            rates[on].append(outcome.e2e_rate)
            cpu_us[on].append(outcome.nodes_cpu / args.messages * 1e6)
            rate, cpu = rates[on][-1], cpu_us[on][-1]
            print(f"    {rate:,.0f} msg/s, node CPU {cpu:.1f} us/msg", flush=True)
    off, on = max(rates[False]), max(rates[True])
    print(f"\naudit off: best {off:,.0f} msg/s ({', '.join(f'{r:,.0f}' for r in rates[False])})")
    print(f"audit on:  best {on:,.0f} msg/s ({', '.join(f'{r:,.0f}' for r in rates[True])})")
    cost = (1 - on / off) * 100
    mean_cost = (1 - statistics.mean(rates[True]) / statistics.mean(rates[False])) * 100
    print(f"throughput cost of the audit log: {cost:.1f}% best of each, {mean_cost:.1f}% of means "
          "(target < 15%)")  # fmt: skip
    cpu_off, cpu_on = statistics.median(cpu_us[False]), statistics.median(cpu_us[True])
    print(f"node CPU per message, median: {cpu_off:.1f} us off, {cpu_on:.1f} us on "
          f"(+{cpu_on - cpu_off:.1f} us, +{(cpu_on / cpu_off - 1) * 100:.0f}%)")  # fmt: skip
    fmt, join, size = format_cost()
    print(f"writer thread per event: format {fmt:.2f} us, join and encode {join:.2f} us "
          f"({size:.0f} bytes per event)")  # fmt: skip
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "pinmq-bench")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--no-pure", action="store_true", help="skip the pure-Python pass")
    parser.add_argument("--audit-cost", action="store_true", help="measure the audit log's cost")
    parser.add_argument("--repeat", type=int, default=3, help="--audit-cost: runs per setting")
    parser.add_argument("--messages", type=int, default=60_000, help="--audit-cost: per run")
    args = parser.parse_args()
    if args.audit_cost:
        return audit_cost(args)
    args.dir.mkdir(parents=True, exist_ok=True)
    paths = {n: history(args.dir, n) for n in args.sizes}

    t = time.monotonic()
    spark = session(args.master)
    print(f"SparkSession on {args.master}: {time.monotonic() - t:.1f} s")
    warm = args.dir / "warm-up"
    if not (warm / "GENERATED.json").exists():
        synth.generate(warm, messages=2_000, groups=20)
        (warm / "GENERATED.json").write_text("{}")
    t = time.monotonic()
    job.run(spark, warm)
    print(f"warm-up run (14k events, JIT and first jobs): {time.monotonic() - t:.1f} s")

    rows = []
    ok = True
    for path in paths.values():
        before = os.getloadavg()[0]
        t = time.monotonic()
        checks_only = job.run(spark, path, with_stats=False)
        t_checks = time.monotonic() - t
        t = time.monotonic()
        full = job.run(spark, path)
        t_full = time.monotonic() - t
        cache = args.dir / f"cache-{path.name}"
        shutil.rmtree(cache, ignore_errors=True)
        t_cached = []  # `--cache`: converting, then reusing it
        for expected in ("converted", "reused"):
            t = time.monotonic()
            cached = job.run(spark, path, cache=cache)
            t_cached.append(time.monotonic() - t)
            ok &= cached.clean and cached.history.cache == expected
        t_own = own_process(path, cache, args.master)
        ok &= t_own is not None
        t_pure = None
        if not args.no_pure:
            t = time.monotonic()
            counts = pure.check(path)
            t_pure = time.monotonic() - t
            ok &= not any(counts.values())
        ok &= checks_only.clean and full.clean
        lines = full.history.lines
        load = f"{before:.1f} -> {os.getloadavg()[0]:.1f}"
        rows.append((lines, size_of(path), t_checks, t_full, *t_cached, t_own, t_pure, load))
        print(
            f"{lines:>12,} events: spark checks {t_checks:6.1f} s, checks+stats {t_full:6.1f} s, "
            f"with --cache converting {t_cached[0]:6.1f} s, reusing it {t_cached[1]:6.1f} s "
            f"(in a process of its own {t_own or 0:6.1f} s), "
            + (f"pure Python {t_pure:6.1f} s" if t_pure is not None else "pure Python skipped")
            + f" (load average {load})",
            flush=True,
        )

    print()
    print(
        "| events | JSON size | Spark checks | Spark checks + stats | --cache, converting | "
        "--cache, reused | reused / uncached | pinmq check, reused, own process | pure Python | "
        "pure / Spark (checks + stats) | Spark µs per event | load average |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for lines, size, t_checks, t_full, t_convert, t_reuse, t_own, t_pure, load in rows:
        ratio = f"{t_pure / t_full:.2f}x" if t_pure else "-"
        pure_s = f"{t_pure:.1f} s" if t_pure else "-"
        print(
            f"| {lines:,} | {size / 1e6:,.0f} MB | {t_checks:.1f} s | {t_full:.1f} s "
            f"| {t_convert:.1f} s | {t_reuse:.1f} s | {t_reuse / t_full:.2f}x "
            f"| {t_own or 0:.1f} s | {pure_s} "
            f"| {ratio} | {t_full / lines * 1e6:.2f} | {load} |"
        )
    if len(rows) > 1:
        (l0, _, _, f0, *_), (l1, _, _, f1, *_) = rows[0], rows[-1]
        print(f"\ngrowth: {l1 / l0:.1f}x events took {f1 / f0:.1f}x the time (checks + stats)")
    spark.stop()
    if not ok:
        print("FAIL: a clean history was reported with violations", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
