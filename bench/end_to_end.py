"""End-to-end throughput and latency of grouped messages through one real pinmq node.

The script starts one `pinmq node` subprocess (temporary data dir, reserved loopback ports;
it is stopped on exit, error, Ctrl-C or SIGTERM) and, per scenario, a fresh durable queue with
3 consumers and one producer. The producer streams N grouped messages (message i to group
i % G, JMSXGroupID and JMSXGroupSeq set, send time in the body) with `send_many`, concurrently
with the consumers, which receive them (prefetch 100) and ack each batch with `ack_many`. The
load generator (bench/harness) runs in spawned processes, each with its own client: by default
one producer process and one process hosting the 3 consumers (`--layout shared`), which
measured as fast as one process per consumer (`--layout split`) for about 20 % less client CPU.

Per scenario it prints end-to-end msg/s (first send to the server's receipt for the ack of the
N-th message), producer msg/s (first send to last send confirmed), p50/p99 send-to-delivery
latency, delivery rates while and after producing, the CPU used by the client processes, the
node (per thread kind) and the rest of the machine, and PASS/FAIL for exactly-once delivery,
per-group order and one consumer per group. `--audit` runs the node with its audit log on;
`--persist-delivery-count` sets when delivery counts are stored before delivery.
`--scrape-every S` runs each scenario twice per repeat, alone and while a thread scrapes the
node's `GET /metrics` every S seconds (in turn first), and prints the medians of both and
their ratios: what Prometheus costs the node under load.

Usage: python bench/end_to_end.py [--quick | --messages N] [--layout shared|split] [--repeat R]
       [--groups G ...] [--modes persistent non-persistent] [--audit]
       [--persist-delivery-count none|grouped|all] [--scrape-every S]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import uuid
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from harness.clients import BODY_BYTES, Plan, group_name
from harness.load import Outcome, add_load_args, hosts_for, print_outcome, run_load
from harness.nodes import NodeProc, running_node
from harness.procs import fsync_ms, run_main
from harness.scrape import Scraper

from broker.client import Client

CONSUMERS = 3
TARGET = 15_000  # persistent grouped msg/s end-to-end on a 2-core machine

Best = dict[tuple[int, bool], Outcome]


async def scenario(
    client: Client, node: NodeProc, n: int, groups: int, persistent: bool, args: argparse.Namespace
) -> Outcome:
    """One run on a fresh queue: N messages over `groups` groups, verified."""
    queue = f"e2e-{groups}-{'p' if persistent else 'np'}-{uuid.uuid4().hex[:6]}"
    await client.create_queue(queue)
    plan = Plan(node.url, node.node_id, 0, n, tuple(group_name(g) for g in range(groups)))
    hosts = hosts_for([node], CONSUMERS, CONSUMERS if args.layout == "split" else 1)
    outcome = await run_load([node], queue, [plan], hosts, persistent, args, 0.0)
    await client.delete_queue(queue)
    return outcome


async def measure(args: argparse.Namespace) -> tuple[bool, Best]:
    """Every scenario `args.repeat` times on one node; (all checks passed, best by e2e msg/s)."""
    n = args.messages or (6_000 if args.quick else 60_000)
    layout = (
        "1 producer process + 1 process per consumer"
        if args.layout == "split"
        else f"1 producer process + 1 process hosting all {CONSUMERS} consumers"
    )
    print(
        f"pinmq end-to-end: {n:,} messages/scenario, {BODY_BYTES} B bodies, {CONSUMERS} consumers "
        f"(prefetch {args.prefetch}, ack_many), send_many batch {args.batch} x window "
        f"{args.window}; layout {args.layout}: {layout}; audit log "
        f"{'on' if args.audit else 'off'}; persist-delivery-count-before-delivery "
        f"{args.persist_delivery_count}"
    )
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    best: Best = {}
    ok = True
    with tempfile.TemporaryDirectory(prefix="pinmq-e2e-") as tmp:
        work = Path(tmp)
        extra: dict[str, Any] = {
            "persist-delivery-count-before-delivery": args.persist_delivery_count,
            "store": {"format": args.store},
        }
        if args.audit:
            extra["audit"] = {"enabled": True, "dir": str(work / "audit")}
        with running_node(work, extra) as node:
            async with Client(node.url) as client:
                for run in range(1, args.repeat + 1):
                    for groups in args.groups:
                        for persistent in (m == "persistent" for m in args.modes):
                            # With --scrape-every, each run twice, in turn scraped first or not.
                            for scraped in _scraping(args.scrape_every, run):
                                p50, _ = fsync_ms(work)
                                http = node.listen["http"]
                                scraper = Scraper(http, args.scrape_every) if scraped else None
                                with scraper or nullcontext():
                                    o = await scenario(client, node, n, groups, persistent, args)
                                kind = "persistent" if persistent else "non-persistent"
                                of = f" (run {run}/{args.repeat})" if args.repeat > 1 else ""
                                label = f"{CONSUMERS} consumers, {groups} groups, {kind}{of}"
                                print_outcome(f"{label}{', scraped' if scraped else ''}", o)
                                print(f"  fsync just before       p50 {p50:.2f} ms")
                                if scraper is not None:
                                    print(f"  /metrics                {scraper.summary()}")
                                ok &= o.ok
                                key = (groups, persistent)
                                if scraped:
                                    SCRAPED.setdefault(key, ([], []))[1].append(o)
                                    continue
                                SCRAPED.setdefault(key, ([], []))[0].append(o)
                                if key not in best or o.e2e_rate > best[key].e2e_rate:
                                    best[key] = o
    return ok, best


# (groups, persistent) -> (outcomes not scraped, outcomes scraped), with --scrape-every.
SCRAPED: dict[tuple[int, bool], tuple[list[Outcome], list[Outcome]]] = {}


def _scraping(every_s: float, run: int) -> tuple[bool, ...]:
    """Which runs of a scenario scrape /metrics: none without --scrape-every, else both, the
    scraped one first in every other repeat (so a drift of the machine weighs on both)."""
    if not every_s:
        return (False,)
    return (False, True) if run % 2 else (True, False)


def scraping_summary(every_s: float) -> None:
    """Medians with and without a scrape every `every_s` seconds, and their ratios."""
    print(f"\n== /metrics scraped every {every_s} s against not scraped, medians ==")
    print(
        f"{'groups':>7} {'mode':<15}{'e2e msg/s':>10}{'scraped':>10}{'ratio':>7}"
        f"{'node CPU':>9}{'scraped':>9}{'ratio':>7}"
    )
    for (groups, persistent), (off, on) in SCRAPED.items():
        rate = [statistics.median(o.e2e_rate for o in runs) for runs in (off, on)]
        cpu = [statistics.median(o.nodes_cpu for o in runs) for runs in (off, on)]
        print(
            f"{groups:>7} {'persistent' if persistent else 'non-persistent':<15}"
            f"{rate[0]:>10,.0f}{rate[1]:>10,.0f}{rate[1] / rate[0]:>7.3f}"
            f"{cpu[0]:>8.2f}s{cpu[1]:>8.2f}s{cpu[1] / cpu[0]:>7.3f}"
        )


def summary(args: argparse.Namespace, ok: bool, best: Best) -> None:
    which = f", best of {args.repeat} runs by end-to-end msg/s" if args.repeat > 1 else ""
    print(f"\n== summary{which} ==")
    print(
        f"{'groups':>7} {'mode':<15}{'e2e msg/s':>10}{'send msg/s':>11}{'p50 ms':>8}"
        f"{'p99 ms':>8}{'client CPU':>11}{'node CPU':>9}  checks"
    )
    for (groups, persistent), o in best.items():
        print(
            f"{groups:>7} {'persistent' if persistent else 'non-persistent':<15}"
            f"{o.e2e_rate:>10,.0f}{o.send_rate:>11,.0f}{o.p50_ms:>8.1f}{o.p99_ms:>8.1f}"
            f"{o.client_cpu:>10.2f}s{o.nodes_cpu:>8.2f}s  {'PASS' if o.ok else 'FAIL'}"
        )
    for groups in args.groups:
        p, np_ = best.get((groups, True)), best.get((groups, False))
        if p and np_:
            print(
                f"ratio persistent / non-persistent, {groups} groups: "
                f"{p.e2e_rate / np_.e2e_rate:.2f} ({p.e2e_rate:,.0f} / {np_.e2e_rate:,.0f} msg/s)"
            )
    for (groups, persistent), o in best.items():
        if persistent:
            verdict = "MET" if o.e2e_rate >= TARGET else "NOT MET"
            print(
                f"target >= {TARGET:,} persistent grouped msg/s end-to-end on 2 cores, "
                f"{groups} groups: {o.e2e_rate:,.0f} -> {verdict}"
            )
    if args.scrape_every:
        scraping_summary(args.scrape_every)
    print(f"load average {os.getloadavg()[0]:.2f} at end; all checks {'PASS' if ok else 'FAIL'}")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="6,000 messages per scenario")
    size.add_argument("--messages", type=int, metavar="N", help="messages per scenario")
    parser.add_argument(
        "--layout",
        choices=("split", "shared"),
        default="shared",
        help="split: one process per consumer; shared: one process hosts all consumers",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per scenario; best is kept")
    parser.add_argument("--groups", type=int, nargs="+", default=[100, 1000], metavar="G")
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=("persistent", "non-persistent"),
        default=["persistent", "non-persistent"],
    )
    parser.add_argument("--audit", action="store_true", help="the node writes its audit log")
    parser.add_argument(
        "--scrape-every",
        type=float,
        default=0.0,
        metavar="S",
        help="run each scenario also while GET /metrics is scraped every S s, and compare",
    )
    parser.add_argument(
        "--persist-delivery-count",
        choices=("none", "grouped", "all"),
        default="grouped",
        help="the node's persist-delivery-count-before-delivery (default: %(default)s)",
    )
    parser.add_argument(
        "--store",
        choices=("auto", "sqlite", "journal"),
        default="auto",
        help="the node's store.format (default: %(default)s)",
    )
    add_load_args(parser)
    return parser


def main() -> None:
    args = parser().parse_args()

    def body() -> bool:
        ok, best = asyncio.run(measure(args))
        summary(args, ok, best)
        return ok

    run_main(body)


if __name__ == "__main__":
    main()
