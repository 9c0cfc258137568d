"""One load run through real nodes: consumer and producer processes, timing, CPU, checks.

`run_load` starts the consumer processes (`hosts`), checks that every node counts its
consumers, lets gossip settle, starts the producers (`plans`), says go, and returns an
`Outcome`: end-to-end and send rates, send-to-delivery percentiles, CPU of the nodes (by
thread kind), the clients and the machine, and the exactly-once / order / exclusivity checks.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.clients import STALL_S, Plan, Seen, consumer_main, group_name, producer_main
from harness.nodes import NodeProc, admin, node_queues
from harness.procs import (
    MachineCpu,
    NodeCpu,
    end_workers,
    machine_cpu,
    next_event_async,
    node_cpu,
    used,
)
from harness.stats import Checks, order_checks, passed, pct

PREFETCH = 100
BATCH_SIZE = 200  # send_many batch size
WINDOW = 16  # send_many batches in flight
START_TIMEOUT_S = 30.0  # client processes ready
RUN_TIMEOUT_S = 600.0


@dataclass(slots=True)
class Host:
    """One consumer process: its node and the consumers it hosts."""

    node: NodeProc
    names: list[str]


@dataclass(slots=True)
class Outcome:
    total: int
    e2e_rate: float  # first send -> receipt of the ack of the last message
    send_rate: float  # first send -> last send confirmed
    p50_ms: float  # send -> delivery
    p99_ms: float
    elapsed: float
    rate_producing: float  # deliveries/s while the producers were sending
    rate_after: float  # deliveries/s after the last send was confirmed
    node_cpu: dict[str, NodeCpu]
    producer_cpu: float
    consumer_cpu: float
    parent_cpu: float  # this script
    machine: MachineCpu  # the whole machine during the run
    forwarded: int  # delivered on another node than the one it was sent to
    per_node: dict[str, tuple[int, int]]  # node -> (groups, messages) delivered there
    checks: Checks

    @property
    def ok(self) -> bool:
        return passed(self.checks)

    @property
    def nodes_cpu(self) -> float:
        return sum(c.total for c in self.node_cpu.values())

    @property
    def client_cpu(self) -> float:
        return self.producer_cpu + self.consumer_cpu + self.parent_cpu


def add_load_args(parser: argparse.ArgumentParser) -> None:
    """The client knobs every load benchmark takes."""
    parser.add_argument("--prefetch", type=int, default=PREFETCH, help="consumer prefetch")
    parser.add_argument("--batch", type=int, default=BATCH_SIZE, help="send_many batch size")
    parser.add_argument("--window", type=int, default=WINDOW, help="send_many batches in flight")


def plans_for(
    nodes: Sequence[NodeProc], n: int, groups: int, own: bool, producers: int = 3
) -> list[Plan]:
    """`producers` producers, producer k on nodes[k % len(nodes)], n messages in all.

    `own`: producer k sends only groups k, k + producers, ...; else every producer sends to
    every group, producer k starting at group k * groups / producers.
    """
    names = [group_name(g) for g in range(groups)]
    counts = [n // producers + (1 if k < n % producers else 0) for k in range(producers)]
    plans = []
    for k in range(producers):
        node = nodes[k % len(nodes)]
        if own:
            plans.append(Plan(node.url, node.node_id, k, counts[k], tuple(names[k::producers])))
        else:
            offset = k * groups // producers
            plans.append(Plan(node.url, node.node_id, k, counts[k], tuple(names), offset))
    return plans


def hosts_for(nodes: Sequence[NodeProc], consumers: int, processes: int) -> list[Host]:
    """`consumers` consumers c1, c2, ... in `processes` processes (at least one per node),
    spread over the processes and the nodes round robin."""
    hosts = [Host(nodes[i % len(nodes)], []) for i in range(max(processes, len(nodes)))]
    for c in range(consumers):
        hosts[c % len(hosts)].names.append(f"c{c + 1}")
    return [h for h in hosts if h.names]


async def run_load(
    nodes: Sequence[NodeProc],
    queue: str,
    plans: Sequence[Plan],
    hosts: Sequence[Host],
    persistent: bool,
    args: argparse.Namespace,
    settle_s: float,
) -> Outcome:
    """Consumers subscribe, `settle_s` later the producers start; verify what arrived.

    The queue must exist on every node of `nodes` (and be empty).
    """
    ctx = mp.get_context("spawn")
    total = sum(p.count for p in plans)
    events = ctx.Queue()
    go = ctx.Event()
    acked = ctx.Value("q", 0)
    pids = [n.pid for n in nodes]
    shared = (acked, pids, events)
    reach = {n.url: n.reach for n in nodes}
    consumers = [
        ctx.Process(
            target=consumer_main,
            args=(
                h.node.url,
                h.node.reach,
                h.node.node_id,
                queue,
                h.names,
                args.prefetch,
                total,
                *shared,
            ),
            daemon=True,
        )
        for h in hosts
    ]
    producers = [
        ctx.Process(
            target=producer_main,
            args=(plan, reach[plan.url], queue, persistent, args.batch, args.window, events, go),
            daemon=True,
        )
        for plan in plans
    ]
    procs = consumers + producers
    results: dict[int, dict[str, Any]] = {}
    seen: list[Seen] = []
    consumer_cpu = 0.0
    try:
        for p in consumers:
            p.start()
        for _ in consumers:
            kind, _who = await next_event_async(events, procs, START_TIMEOUT_S)
            assert kind == "ready", kind
        for node in nodes:
            expected = sum(len(h.names) for h in hosts if h.node is node)
            got = (await node_queues(node)).get(queue, (0, expected))[1]
            if got != expected:
                raise RuntimeError(f"{node.node_id}: {got} consumers on {queue}, not {expected}")
        await asyncio.sleep(settle_s)
        for p in producers:
            p.start()
        for _ in producers:
            kind, _who = await next_event_async(events, procs, START_TIMEOUT_S)
            assert kind == "ready", kind
        node_cpu0 = [node_cpu(p) for p in pids]
        machine0, my_cpu0 = machine_cpu(), time.process_time()
        go.set()
        for _ in procs:
            kind, payload = await next_event_async(events, procs, RUN_TIMEOUT_S)
            if kind == "producer":
                results[payload["index"]] = payload
            else:
                seen += payload["seen"]
                consumer_cpu += payload["cpu"]
        my_cpu = time.process_time() - my_cpu0
        for p in procs:
            await asyncio.to_thread(p.join, 10)
        depths = await _depths(nodes, queue)
    finally:
        end_workers(procs, events)

    enders = [s for s in seen if s.end_ns]
    if not enders:
        got = sum(len(s.seqs) for s in seen)
        raise RuntimeError(f"stalled: {got} of {total} messages delivered, no ack for {STALL_S} s")
    end = enders[0]
    first = min(r["first_ns"] for r in results.values())
    done = max(r["done_ns"] for r in results.values())
    elapsed = (end.end_ns - first) / 1e9
    latencies = sorted(x for s in seen for x in s.latency_ns)
    during = sum(k for s in seen for t, k in s.arrivals if t <= done)
    node_of = {p.index: p.node_id for p in plans}
    forwarded = sum(1 for s in seen for p in s.producers if node_of.get(p, s.node_id) != s.node_id)
    per_node: dict[str, tuple[int, int]] = {}
    for node in nodes:
        mine = [s for s in seen if s.node_id == node.node_id]
        per_node[node.node_id] = (
            len({g for s in mine for g in s.groups if g}),
            sum(len(s.seqs) for s in mine),
        )
    return Outcome(
        total=total,
        e2e_rate=total / elapsed,
        send_rate=total / ((done - first) / 1e9),
        p50_ms=pct(latencies, 0.5) / 1e6,
        p99_ms=pct(latencies, 0.99) / 1e6,
        elapsed=elapsed,
        rate_producing=during / max((done - first) / 1e9, 1e-9),
        rate_after=(total - during) / max((end.end_ns - done) / 1e9, 1e-9),
        node_cpu={n.node_id: used(end.node_cpu_end[i], node_cpu0[i]) for i, n in enumerate(nodes)},
        producer_cpu=sum(r["cpu"] for r in results.values()),
        consumer_cpu=consumer_cpu,
        parent_cpu=my_cpu,
        machine=used(end.machine_end, machine0),
        forwarded=forwarded,
        per_node=per_node,
        checks=verify(seen, plans, results, depths),
    )


async def _depths(nodes: Sequence[NodeProc], queue: str) -> dict[str, int]:
    """Depth of `queue` and of every store-and-forward queue on every node, after a run."""
    depths: dict[str, int] = {}
    for node in nodes:
        for name, (depth, _consumers) in (await node_queues(node)).items():
            if name == queue or name.startswith("$sf."):
                depths[f"{name}@{node.node_id}"] = depth
        async with node.client() as client:
            groups = await admin(client.groups(queue))
        held = sum(g.pending + g.outstanding for g in groups)
        if held:
            depths[f"groups of {queue}@{node.node_id}"] = held
    return depths


def verify(
    seen: list[Seen],
    plans: Sequence[Plan],
    results: dict[int, dict[str, Any]],
    depths: dict[str, int],
) -> Checks:
    """Exactly-once, per-group order and one consumer per group, with a one-line reason each."""
    total = sum(p.count for p in plans)
    sent = sum(r["sent"] for r in results.values())
    by_index = {p.index: p for p in plans}
    keys = [(p, q) for s in seen for p, q in zip(s.producers, s.seqs, strict=True)]
    expected = {(p.index, q) for p in plans for q in range(1, p.count + 1)}
    wrong_group = sum(
        1
        for s in seen
        for g, p, q in zip(s.groups, s.producers, s.seqs, strict=True)
        if p not in by_index or (by_index[p].group_of(q) or "") != g
    )
    redelivered = sum(s.redelivered for s in seen)
    extra = sum(s.extra for s in seen)
    left = {k: v for k, v in depths.items() if v}
    once = (
        sent == total
        and len(keys) == total
        and set(keys) == expected
        and redelivered == 0
        and extra == 0
        and wrong_group == 0
        and not left
    )
    once_why = (
        f"sent {sent}, delivered {len(keys)}, distinct {len(set(keys))} of {total}, "
        f"redelivered {redelivered}, late extras {extra}, wrong group {wrong_group}, "
        f"left in queues {left or 'none'}"
    )
    spread = "groups per consumer: " + ", ".join(
        f"{s.name}@{s.node_id} {len(set(s.groups) - {''})}" for s in seen
    )
    streams = [
        (
            f"{s.name}@{s.node_id}",
            ((g, (g, p), q) for g, p, q in zip(s.groups, s.producers, s.seqs, strict=True)),
        )
        for s in seen
    ]
    checks = {"exactly-once": (once, once_why), **order_checks(streams, spread)}
    if not any(p.groups for p in plans):
        del checks["one consumer per group"]
    return checks


def print_outcome(label: str, o: Outcome) -> None:
    """The figures and checks of one run."""
    print(f"\n== {label} ==")
    print(
        f"  end-to-end              {o.e2e_rate:>8,.0f} msg/s  "
        f"({o.total:,} messages, {o.elapsed:.2f} s first send -> last ack)"
    )
    print(f"  producers send          {o.send_rate:>8,.0f} msg/s")
    print(f"  send -> delivery        p50 {o.p50_ms:.1f} ms, p99 {o.p99_ms:.1f} ms")
    print(
        f"  deliveries              {o.rate_producing:,.0f} msg/s while producing, "
        f"{o.rate_after:,.0f} msg/s after the last send"
    )
    per = ", ".join(f"{k} {v.total:.2f} s" for k, v in o.node_cpu.items())
    print(
        f"  CPU                     nodes {o.nodes_cpu:.2f} s ({per}); "
        f"clients {o.client_cpu:.2f} s (producers {o.producer_cpu:.2f}, "
        f"consumers {o.consumer_cpu:.2f}, this script {o.parent_cpu:.2f})"
    )
    print(f"  node CPU per message    {o.nodes_cpu / o.total * 1e6:.0f} us")
    for node_id, c in o.node_cpu.items():
        print(
            f"  {node_id} CPU split{'':<{max(0, 14 - len(node_id))}}event loop {c.loop:.2f} s "
            f"({c.loop / o.elapsed:.0%} of the run), store writer + other threads "
            f"{c.total - c.loop - c.grpc:.2f} s, gRPC C-core threads {c.grpc:.2f} s"
        )
    m = o.machine
    others = max(0.0, m.busy - o.client_cpu - o.nodes_cpu)
    print(
        f"  machine during the run  {m.busy / o.elapsed:.2f} of {os.cpu_count()} cores busy, "
        f"{others:.2f} s CPU elsewhere (other processes, kernel), iowait {m.iowait:.2f} s, "
        f"steal {m.steal:.2f} s"
    )
    if len(o.per_node) > 1:
        spread = ", ".join(f"{k}: {g} groups / {n:,} msgs" for k, (g, n) in o.per_node.items())
        print(f"  delivered per node      {spread}")
        print(f"  forwarded               {o.forwarded:,} ({o.forwarded / o.total:.0%})")
    for name, (ok, why) in o.checks.items():
        print(f"  {name:<24}{'PASS' if ok else 'FAIL'}  ({why})")
