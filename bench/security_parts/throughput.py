"""Parts 1 and 2 of bench/security.py: gRPC and STOMP throughput on each variant, in turns.

gRPC runs bench/end_to_end.py's scenario (one producer process streaming persistent messages
over 100 groups with send_many, 3 consumers acking with ack_many, verified exactly-once and in
order); STOMP runs bench/stomp_vs_activemq.py's "concurrent" scenario (stomp.py, 1 producer,
3 consumers, client-individual acks, 100 groups). Connection set-up, the password check
included, stays out of the timed region as it does for plain connections.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from dataclasses import dataclass, field

import end_to_end
import stomp_vs_activemq
from harness.stats import Checks, passed
from stomp_load.activemq import Running

from security_parts.variants import GROUPS, LABEL, VARIANTS, Variant, ratio_text, rotation

TARGET_COST = 0.20  # the bound on what TLS + security may cost in throughput


@dataclass(slots=True, frozen=True)
class Run:
    """One throughput run: end-to-end msg/s and CPU per message (node, client processes)."""

    rate: float
    node_us: float
    client_us: float


@dataclass(slots=True)
class Rates:
    """The runs of one protocol per variant, one per round; whether every check passed."""

    runs: dict[str, list[Run]] = field(default_factory=lambda: {v: [] for v in VARIANTS})
    ok: bool = True
    notes: list[str] = field(default_factory=list)

    def median(self, variant: str, what: str = "rate") -> float:
        runs = self.runs[variant]
        return statistics.median(getattr(r, what) for r in runs) if runs else 0.0

    def add(self, proto: str, round_: int, variant: str, run: Run, checks: Checks) -> None:
        """Record a run and print its line."""
        self.runs[variant].append(run)
        ok = passed(checks)
        self.ok &= ok
        self.notes += [
            f"{proto} {variant}: {k}: {why}" for k, (good, why) in checks.items() if not good
        ]
        print(
            f"  {proto:<6}round {round_ + 1} {LABEL[variant]:<15}{run.rate:>8,.0f} msg/s end to "
            f"end; CPU per message: node {run.node_us:.0f} us, clients {run.client_us:.0f} us; "
            f"checks {'PASS' if ok else 'FAIL'}",
            flush=True,
        )


async def grpc_throughput(
    variants: dict[str, Variant], n: int, rounds: int, args: argparse.Namespace
) -> Rates:
    """end_to_end's scenario (100 groups, persistent) on each variant, `rounds` times."""
    rates = Rates()
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            v: await stack.enter_async_context(variants[v].node.client()) for v in VARIANTS
        }  # one each for the queues: its password check, on its first call, is not timed
        for r in range(rounds):
            for v in rotation(r):
                o = await end_to_end.scenario(clients[v], variants[v].node, n, GROUPS, True, args)
                run = Run(o.e2e_rate, o.nodes_cpu / n * 1e6, o.client_cpu / n * 1e6)
                rates.add("gRPC", r, v, run, o.checks)
    return rates


def stomp_throughput(variants: dict[str, Variant], n: int, rounds: int) -> Rates:
    """stomp_vs_activemq's concurrent scenario (100 groups) on each variant."""
    rates = Rates()
    for r in range(rounds):
        for v in rotation(r):
            host, port = variants[v].stomp
            node = variants[v].node
            target = Running(host, port, node.pid, v, 0.0)
            o = stomp_vs_activemq.run_scenario(v, target, n, GROUPS, "concurrent", node.reach)
            run = Run(o.consume_rate, o.broker_cpu / n * 1e6, o.client_cpu / n * 1e6)
            rates.add("STOMP", r, v, run, o.checks)
    return rates


def print_throughputs(grpc: Rates, stomp: Rates, grpc_n: int, stomp_n: int, rounds: int) -> None:
    """The summary's throughput table: `grpc_n` and `stomp_n` messages a run."""
    print(
        f"\nthroughput, {GROUPS} groups, persistent, acked; gRPC {grpc_n:,} and STOMP "
        f"{stomp_n:,} messages per run, {rounds} rounds; CPU in us per message"
    )
    print(
        f"{'':<6}{'variant':<16}{'msg/s':>8}{'ratio':>7}{'per-round':>11}{'node':>7}"
        f"{'clients':>9}   (msg/s of each round)"
    )
    _print_rows("gRPC", grpc)
    _print_rows("STOMP", stomp)


def _print_rows(proto: str, rates: Rates) -> None:
    """One protocol's rows: medians, ratios to plain, and the cost against the target."""
    base = rates.median("plain")
    for v in VARIANTS:
        m = rates.median(v)
        runs = ", ".join(f"{r.rate:,.0f}" for r in rates.runs[v])
        pairs = zip(rates.runs[v], rates.runs["plain"], strict=True)
        paired = [r.rate / p.rate for r, p in pairs if p.rate > 0]
        spread = f"{min(paired):.2f}-{max(paired):.2f}" if paired and v != "plain" else ""
        print(
            f"{proto:<6}{LABEL[v]:<16}{m:>8,.0f}{ratio_text(m, base):>7}{spread:>11}"
            f"{rates.median(v, 'node_us'):>7.0f}{rates.median(v, 'client_us'):>9.0f}   ({runs})"
        )
    if base > 0:
        cost = 1 - rates.median("secure") / base
        verdict = "MET" if cost < TARGET_COST else "NOT MET"
        print(
            f"      cost of TLS + security: {cost:.0%} of plain's msg/s "
            f"(target < {TARGET_COST:.0%}: {verdict})"
        )
