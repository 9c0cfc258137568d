"""The same STOMP workload against ActiveMQ Classic 5.17 and a pinmq node, in one run.

Installs Debian's `activemq` package when it is missing, starts ActiveMQ on loopback with a
STOMP connector (private base/conf/data under a temp dir, its defaults otherwise), a `pinmq node`
(temp data dir, free loopback ports, `consumers-before-dispatch: 3` for the benchmark's queues)
and a do-nothing STOMP sink, then runs four scenarios: 100 groups and 1 group, each "backlog"
(send all N, then the consumers subscribe and drain) and "concurrent" (consumers subscribed,
then the producer starts). Each scenario runs on each broker back to back, one broker at a time,
so that the pair sees the same background load (an idle broker uses < 0.01 core). First, an
unreported pass of the four scenarios (5,000 messages each) warms the JVM's JIT; ActiveMQ still
gets faster over the next rounds, so `--rounds 3` (medians) gives steadier figures.

Workload (stomp.py, STOMP 1.2, TCP_NODELAY): one producer process sends N persistent messages
(`persistent:true`, 100 B bodies, `JMSXGroupID` plus our own `x-group` / `x-seq` headers, since
ActiveMQ does not echo JMSXGroupID) and waits for a receipt every 100 sends; 3 consumer
processes, connected beforehand, subscribe together on one go signal with `client-individual`
and `activemq.prefetchSize:100`, and ack each message with the MESSAGE frame's `ack` header.

Rates: send = N / (first send -> receipt of the last batch); consume = N / (consumers' go ->
receipt of the N-th ack) for backlog, N / (first send -> receipt of the N-th ack) for concurrent.
Checks: exactly-once (every (group, seq) once, no redelivery, nothing left on the queue after
the run), order within each group, one consumer per group; plus the groups-per-consumer spread.
"Even" means the consumers' group counts differ by at most one. The sink (in-memory, no
persistence; bench/stomp_load/sink.py) shows what the load generator itself reaches on this
machine, and the client processes' CPU seconds are printed next to the broker's.

Usage: python bench/stomp_vs_activemq.py [--quick | --messages N] [--only pinmq|activemq]
                                         [--rounds R]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.procs import end_workers, machine_cpu, next_event, proc_cpu, run_main
from harness.reach import PLAIN, Reach
from harness.stats import order_checks, passed
from stomp_load import workers
from stomp_load.activemq import Running, ensure_installed, running_activemq
from stomp_load.pinmq_node import running_pinmq
from stomp_load.sink import running_sink

CONSUMERS = 3
PREFETCH = 100
TARGET_RATIO = 1.5  # pinmq / ActiveMQ grouped consume rate
PATTERN = "stompbench.#"  # pinmq address-settings entry for the benchmark's queues
SCENARIOS = [(100, "backlog"), (100, "concurrent"), (1, "backlog"), (1, "concurrent")]
START_TIMEOUT_S = 60.0
MIN_RATE = 100  # msg/s: a scenario slower than this (plus a minute) is given up as failed
WARMUP = 5_000  # messages per scenario of an unreported first pass (at most N): JIT warm-up
LABEL = {"activemq": "ActiveMQ", "pinmq": "pinmq", "sink": "sink"}


@dataclass(slots=True)
class Outcome:
    """One scenario's figures and checks."""

    broker: str
    groups: int
    mode: str
    send_rate: float
    consume_rate: float
    send_s: float
    consume_s: float
    client_cpu: float
    broker_cpu: float
    per_consumer: list[tuple[int, int]]  # (groups, messages) per consumer, in subscribe order
    checks: dict[str, tuple[bool, str]]
    load: float  # 1-minute load average right after the scenario
    receipt_waits: list[float]  # seconds the producer waited for each batch receipt
    others: float = 0.0  # cores busy outside this broker and the client processes, on average
    steal: float = 0.0  # cores stolen by the hypervisor, on average
    round: int = 1

    @property
    def passed(self) -> bool:
        return passed(self.checks)

    @property
    def even(self) -> bool:
        counts = [g for g, _ in self.per_consumer]
        return max(counts) - min(counts) <= 1

    @property
    def spread(self) -> str:
        return "/".join(str(g) for g, _ in self.per_consumer)


# ---- one scenario -----------------------------------------------------------------------------


def run_scenario(
    broker: str, target: Running, n: int, groups: int, mode: str, reach: Reach = PLAIN
) -> Outcome:
    """Run one scenario on a fresh queue and verify what the consumers saw (the clients speak
    TLS and log in as `reach` says: bench/security.py's secured nodes)."""
    ctx = mp.get_context("spawn")
    dest = f"/queue/stompbench.{broker}.g{groups}.{mode}.{uuid.uuid4().hex[:6]}"
    events, send_go, sub_go = ctx.Queue(), ctx.Event(), ctx.Event()
    acked = ctx.Value("q", 0)
    names = [f"c{i + 1}" for i in range(CONSUMERS)]
    host, port = target.host, target.port
    procs = [
        ctx.Process(
            target=workers.consumer_main,
            args=(host, port, dest, name, PREFETCH, n, acked, sub_go, events, reach),
            daemon=True,
        )
        for name in names
    ]
    procs.append(
        ctx.Process(
            target=workers.producer_main,
            args=(host, port, dest, n, groups, send_go, events, reach),
            daemon=True,
        )
    )
    seen: list[workers.Seen] = []
    subscribed: list[str] = []
    prod: dict[str, Any] = {}
    try:
        for p in procs:
            p.start()
        for _ in procs:
            kind, _who = next_event(events, procs, START_TIMEOUT_S)
            assert kind == "ready", kind
        cpu0, machine0, wall0 = proc_cpu(target.pid), machine_cpu(), time.monotonic()

        def collect(kinds: set[str], count: int) -> None:
            for _ in range(count):
                kind, payload = next_event(events, procs, 60 + n / MIN_RATE)
                assert kind in kinds, kind
                if kind == "producer":
                    prod.update(payload)
                elif kind == "subscribed":
                    subscribed.append(payload)
                else:
                    seen.append(payload)

        if mode == "backlog":
            send_go.set()
            collect({"producer"}, 1)
            t_sub = time.time()
            sub_go.set()
            collect({"subscribed", "consumer"}, 2 * CONSUMERS)
            start = t_sub
        else:
            sub_go.set()
            collect({"subscribed"}, CONSUMERS)
            send_go.set()
            collect({"producer", "consumer"}, 1 + CONSUMERS)
            start = prod["t0"]
        broker_cpu = proc_cpu(target.pid) - cpu0  # includes the consumers' 0.5 s idle linger
        machine1 = machine_cpu()
        wall = time.monotonic() - wall0
        for p in procs:
            p.join(10)
    finally:
        end_workers(procs, events)
    left = workers.drain(host, port, dest, CONSUMERS, reach)
    client_cpu = prod["cpu"] + sum(s.cpu for s in seen)
    end = max(s.end for s in seen)
    order = {name: i for i, name in enumerate(subscribed)}
    seen.sort(key=lambda s: order[s.name])
    return Outcome(
        broker=broker,
        groups=groups,
        mode=mode,
        send_rate=n / (prod["t1"] - prod["t0"]),
        consume_rate=n / (end - start),
        send_s=prod["t1"] - prod["t0"],
        consume_s=end - start,
        client_cpu=client_cpu,
        broker_cpu=broker_cpu,
        per_consumer=[(len(set(s.groups)), len(s.groups)) for s in seen],
        checks=verify(seen, n, groups, prod["sent"], left),
        load=os.getloadavg()[0],
        receipt_waits=sorted(prod["waits"]),
        others=max(0.0, (machine1.busy - machine0.busy) - broker_cpu - client_cpu) / wall,
        steal=(machine1.steal - machine0.steal) / wall,
    )


def verify(
    seen: list[workers.Seen], n: int, groups: int, sent: int, left: int
) -> dict[str, tuple[bool, str]]:
    """Exactly-once, per-group order and one consumer per group, with a one-line reason each."""
    keys = [(g, q) for s in seen for g, q in zip(s.groups, s.seqs, strict=True)]
    expected = {(f"g{i % groups:04d}", i // groups + 1) for i in range(n)}
    distinct = set(keys)
    redelivered = sum(s.redelivered for s in seen)
    extra = sum(s.extra for s in seen)
    no_headers = sum(s.missing_headers for s in seen)
    once = (
        sent == n
        and len(keys) == n
        and distinct == expected
        and redelivered == extra == no_headers == left == 0
    )
    once_why = (
        f"sent {sent}, delivered {len(keys)}, distinct {len(distinct & expected)} of {n}, "
        f"redelivered {redelivered}, late extras {extra}, left on queue {left}"
        + (f", {no_headers} without x-group/x-seq" if no_headers else "")
    )
    streams = [(s.name, ((g, g, q) for g, q in zip(s.groups, s.seqs, strict=True))) for s in seen]
    return {"exactly-once": (once, once_why), **order_checks(streams)}


# ---- reporting --------------------------------------------------------------------------------


def failed(broker: str, groups: int, mode: str, err: BaseException) -> Outcome:
    """The record of a scenario that did not complete."""
    return Outcome(
        broker=broker,
        groups=groups,
        mode=mode,
        send_rate=0.0,
        consume_rate=0.0,
        send_s=0.0,
        consume_s=0.0,
        client_cpu=0.0,
        broker_cpu=0.0,
        per_consumer=[(0, 0)] * CONSUMERS,
        checks={"completed": (False, f"{type(err).__name__}: {err}"[:300])},
        load=os.getloadavg()[0],
        receipt_waits=[],
    )


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"


def print_outcome(o: Outcome) -> None:
    """One scenario's block."""
    print(f"\n-- {LABEL[o.broker]}: {o.groups} group(s), {o.mode}, round {o.round} --")
    if "completed" in o.checks:
        print(f"  FAILED to complete: {o.checks['completed'][1]}", flush=True)
        return
    w = o.receipt_waits
    print(
        f"  send      {o.send_rate:>8,.0f} msg/s  ({o.send_s:.2f} s; {len(w)} receipt waits: "
        f"p50 {w[len(w) // 2] * 1e3:.1f} ms, p99 {w[int(len(w) * 0.99)] * 1e3:.1f} ms, "
        f"{sum(w) / o.send_s:.0%} of the send time)"
    )
    print(f"  consume   {o.consume_rate:>8,.0f} msg/s  ({o.consume_s:.2f} s)")
    span = o.consume_s + (o.send_s if o.mode == "backlog" else 0.0)
    n = sum(m for _, m in o.per_consumer)
    print(
        f"  CPU       clients {o.client_cpu:.2f} s ({o.client_cpu / span:.2f} cores, "
        f"{o.client_cpu / n * 1e6:.0f} us/msg), broker {o.broker_cpu:.2f} s "
        f"({o.broker_cpu / span:.2f} cores, {o.broker_cpu / n * 1e6:.0f} us/msg)"
    )
    print(
        f"  machine   {o.others:.2f} cores busy outside this benchmark, {o.steal:.2f} stolen; "
        f"load average {o.load:.2f}"
    )
    dist = ", ".join(f"c{i + 1} {g} groups/{m} msgs" for i, (g, m) in enumerate(o.per_consumer))
    print(f"  groups per consumer (subscribe order): {dist}  -> {'even' if o.even else 'UNEVEN'}")
    for name, (ok, why) in o.checks.items():
        print(f"  {name:<24}{'PASS' if ok else 'FAIL'}  ({why})")
    sys.stdout.flush()


@dataclass(slots=True)
class Combined:
    """One broker and scenario over all rounds: median rates, and whether every round passed."""

    send_rate: float
    consume_rate: float
    broker_cpu: float
    passed: bool
    even: bool
    spreads: str


def combine(outcomes: list[Outcome]) -> dict[tuple[str, int, str], Combined]:
    """Median figures per (broker, groups, mode)."""
    keys = dict.fromkeys((o.broker, o.groups, o.mode) for o in outcomes)
    out = {}
    for key in keys:
        runs = [o for o in outcomes if (o.broker, o.groups, o.mode) == key]
        out[key] = Combined(
            send_rate=statistics.median(o.send_rate for o in runs),
            consume_rate=statistics.median(o.consume_rate for o in runs),
            broker_cpu=statistics.median(o.broker_cpu for o in runs),
            passed=all(o.passed for o in runs),
            even=all(o.even for o in runs),
            spreads=", ".join(o.spread for o in runs),
        )
    return out


def print_summary(outcomes: list[Outcome], rounds: int) -> bool:
    """Summary table, pinmq/ActiveMQ ratios and the target verdict; True if all checks passed."""
    print("\n== summary ==")
    print(
        f"{'broker':<9}{'groups':>6} {'mode':<11}{'round':>5}{'send msg/s':>11}"
        f"{'consume msg/s':>14}{'CPU us/msg: clients':>20}{'broker':>7}  "
        f"{'groups/consumer':<16}{'other load':>10}  checks"
    )
    for o in sorted(outcomes, key=lambda o: (list(LABEL).index(o.broker), -o.groups, o.mode)):
        n = max(1, sum(m for _, m in o.per_consumer))
        print(
            f"{LABEL[o.broker]:<9}{o.groups:>6} {o.mode:<11}{o.round:>5}{o.send_rate:>11,.0f}"
            f"{o.consume_rate:>14,.0f}{o.client_cpu / n * 1e6:>20.0f}"
            f"{o.broker_cpu / n * 1e6:>7.0f}  {o.spread:<16}{o.others:>10.2f}  "
            f"{'PASS' if o.passed else 'FAIL'}"
        )
    by = combine(outcomes)
    of = f"medians of {rounds} rounds" if rounds > 1 else "one round"
    print(f"\npinmq / ActiveMQ ({of}):")
    verdicts: list[bool] = []
    for groups, mode in SCENARIOS:
        p, a = by.get(("pinmq", groups, mode)), by.get(("activemq", groups, mode))
        if p is None or a is None:
            continue
        print(
            f"  {groups:>3} group(s) {mode:<10}: send {_ratio(p.send_rate, a.send_rate)}, "
            f"consume {_ratio(p.consume_rate, a.consume_rate)} "
            f"({p.consume_rate:,.0f} / {a.consume_rate:,.0f} msg/s), "
            f"broker CPU per message {_ratio(p.broker_cpu, a.broker_cpu)}"
        )
        if groups > 1:
            met = (
                a.consume_rate > 0
                and p.consume_rate / a.consume_rate >= TARGET_RATIO
                and p.passed
                and a.passed
                and p.even
            )
            verdicts.append(met)
            print(
                f"    target pinmq >= {TARGET_RATIO}x ActiveMQ grouped consume, checks passing, "
                f"groups even (pinmq {p.spreads}; ActiveMQ {a.spreads}) -> "
                f"{'MET' if met else 'NOT MET'}"
            )
    print("load generator ceiling (the same clients against the do-nothing sink), consume:")
    for groups, mode in SCENARIOS:
        sink = by.get(("sink", groups, mode))
        if sink is None or not sink.passed:
            continue
        parts = [f"sink {sink.consume_rate:,.0f} msg/s"]
        for b in ("activemq", "pinmq"):
            c = by.get((b, groups, mode))
            if c is not None and c.consume_rate > 0:
                share = c.consume_rate / sink.consume_rate
                parts.append(f"{LABEL[b]} at {share:.0%} of it")
        print(f"  {groups:>3} group(s) {mode:<10}: " + ", ".join(parts))
    print(
        "  (near or above 100%, a broker's figure is held down by the clients sharing this "
        "machine's cores: a lower bound)"
    )
    if verdicts:
        print(f"target overall: {'MET' if all(verdicts) else 'NOT MET'}")
    return all(o.passed for o in outcomes)


# ---- main -------------------------------------------------------------------------------------


@contextmanager
def _sink(workdir: Path) -> Iterator[Running]:
    with running_sink(workdir, CONSUMERS) as (host, port, pid):
        yield Running(
            host,
            port,
            pid,
            "do-nothing in-memory STOMP sink (bench/stomp_load/sink.py): no persistence, "
            f"dispatch after {CONSUMERS} subscriptions, new group -> fewest groups",
            0.0,
        )


def _scenario(broker: str, target: Running, n: int, groups: int, mode: str) -> Outcome:
    """run_scenario, or the record of its failure (the broker stays up for the next one)."""
    try:
        return run_scenario(broker, target, n, groups, mode)
    except Exception as err:
        return failed(broker, groups, mode, err)


def run(args: argparse.Namespace) -> bool:
    """Start the brokers, then run each scenario on each broker back to back; print it all."""
    n = args.messages or (2_000 if args.quick else 20_000)
    brokers = [args.only] if args.only else ["activemq", "pinmq"]
    print(
        f"STOMP workload: {n:,} persistent messages/scenario, 100 B bodies, 1 producer process "
        f"(receipt every {workers.RECEIPT_EVERY} sends), {CONSUMERS} consumer processes "
        f"(client-individual, activemq.prefetchSize:{PREFETCH}, subscribe together), "
        f"stomp.py with TCP_NODELAY; {args.rounds} round(s)"
    )
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    if "activemq" in brokers:
        print(f"activemq package: {ensure_installed()}")
    starters: dict[str, Callable[[Path], AbstractContextManager[Running]]] = {
        "activemq": running_activemq,
        "pinmq": lambda d: running_pinmq(d, PATTERN, CONSUMERS, args.store),
        "sink": _sink,
    }
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="stompbench-") as tmp, ExitStack() as stack:
        targets: dict[str, Running] = {}
        for broker in [*brokers, "sink"]:
            workdir = Path(tmp) / broker
            workdir.mkdir()
            try:
                targets[broker] = target = stack.enter_context(starters[broker](workdir))
            except Exception as err:  # the broker did not start: say so, go on with the rest
                print(f"\n== {LABEL[broker]} == did not start: {type(err).__name__}: {err}")
                outcomes += [failed(broker, g, m, err) for g, m in SCENARIOS]
                continue
            print(f"\n== {LABEL[broker]} == (STOMP ready {target.started_s:.1f} s after start)")
            print(f"settings: {target.settings}")
        warm = min(WARMUP, n)
        for broker, target in targets.items():
            ws = [_scenario(broker, target, warm, g, m) for g, m in SCENARIOS]
            bad = [why for w in ws for ok, why in w.checks.values() if not ok]
            print(
                f"{LABEL[broker]} warm-up (not counted): the {len(SCENARIOS)} scenarios with "
                f"{warm:,} msgs each, consume "
                + " / ".join(f"{w.consume_rate:,.0f}" for w in ws)
                + f" msg/s, checks {'FAIL (' + bad[0] + ')' if bad else 'PASS'}",
                flush=True,
            )
        for r in range(args.rounds):
            for groups, mode in SCENARIOS:
                for broker, target in targets.items():
                    o = _scenario(broker, target, n, groups, mode)
                    o.round = r + 1
                    print_outcome(o)
                    outcomes.append(o)
    ok = print_summary(outcomes, args.rounds)
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    return ok


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="2,000 messages per scenario")
    size.add_argument("--messages", type=_positive, metavar="N", help="messages per scenario")
    parser.add_argument("--only", choices=("pinmq", "activemq"), help="run one broker only")
    parser.add_argument(
        "--rounds",
        type=_positive,
        default=1,
        help="repeat every scenario; the summary uses medians",
    )
    parser.add_argument(
        "--store",
        choices=("auto", "sqlite", "journal"),
        default="auto",
        help="pinmq's store.format (default: %(default)s)",
    )
    args = parser.parse_args()

    run_main(lambda: run(args))


if __name__ == "__main__":
    main()
