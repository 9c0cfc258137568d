"""Grouping decisions seen from a REMOTE node, and the cost of cached grouped routing.

Part 1, new-group decision latency (target p99 < 5 ms on loopback). A LOCAL grouping handler
(`handler.local.LocalHandler`, bindings in a temporary SQLite file, durable before it answers)
is hosted on a `grpc.aio` server on loopback in a process of its own. This process runs a
`RemoteHandler` (a REMOTE node's handler) and calls `decide()` for N distinct new groups, one at
a time and then with 16 in flight, timing every call; then `decide()` on already-bound keys (a
cache hit, no I/O) and `cached()`. Baseline, in the LOCAL process itself: its own node's
decisions (`LocalHandler.decide`: straight to the arbiter, durable before return), for the
same numbers of new groups and in flight. The same REMOTE measurements then run against a real
`pinmq node` process whose config has a cluster section and a LOCAL grouping handler (its
listen.cluster hosts the service). Printed: p50/p90/p99/max, decisions/s, CPU per decision of
each process, and ratios REMOTE / LOCAL and miss / hit.

Part 2, cached grouped routing versus ungrouped on the same node (target < 10 % slower). A
3-node cluster (bench/cluster_throughput.py starts it: node1 LOCAL, node2/node3 REMOTE,
ON_DEMAND); the script first checks that grouped messages sent through node1 and node2 reach
a consumer on node3 (else it stops with a clear message). Then, through node2 only (one
producer process, 3 consumers on node2 in one process, none elsewhere), one message per group
binds G groups to node2; then M grouped messages over those bound groups, M ungrouped
messages with the same body and two headers of the same size as JMSXGroupID / JMSXGroupSeq
(the target's baseline: it isolates routing), and M bare ungrouped messages (no headers: what
carrying two headers costs) rotate, persistent and non-persistent, R rounds each; printed: the
best end-to-end and send msg/s and the least node CPU per message of each, and ratios. The
same comparison on a standalone node separates the core's own cost of groups from the
cluster's. Every run verifies exactly-once and per-group order.

Every process the script starts is stopped on exit, error, Ctrl-C or SIGTERM; every wait is
bounded; no timing is asserted.

Usage: python bench/cluster_decisions.py [--quick] [--part 1|2|both] [--decisions N]
       [--messages M] [--groups G] [--repeat R] [--no-node]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from grpc import aio
from handler_probes import (
    REMOTE_NODE,
    LocalProcess,
    Remote,
    Stats,
    serves_grouping,
)
from harness.clients import Plan, group_name
from harness.load import Host, Outcome, add_load_args, run_load
from harness.nodes import (
    SETTLE_S,
    ClusterNotWorking,
    NodeProc,
    create_everywhere,
    delete_everywhere,
    probe_send_path,
    running_nodes,
    wait_formed,
)
from harness.procs import fsync_ms, run_main

from broker import logs
from pinmq_pb import client_pb2 as cpb
from pinmq_pb import client_pb2_grpc as cpb_grpc

NODES = 3
CONCURRENCY = (1, 16)
TARGET_P99_MS = 5.0
TARGET_COST = 0.10  # cached grouped routing at most 10 % slower than ungrouped


# ---- part 1 -------------------------------------------------------------------------------------


def _t(ns: float) -> str:
    return f"{ns / 1e3:.1f} us" if ns < 1e6 else f"{ns / 1e6:.2f} ms"


def _row(label: str, s: Stats) -> None:
    cpu = ", ".join(f"{k} {v / len(s.latencies) * 1e6:.0f}" for k, v in s.cpu.items())
    commits = f", {s.commits:,} commits" if s.commits >= 0 else ""
    print(
        f"  {label:<40}{len(s.latencies):>7,}{_t(s.pct(0.5)):>11}{_t(s.pct(0.9)):>11}"
        f"{_t(s.pct(0.99)):>11}{_t(s.latencies[-1]):>11}{s.rate:>12,.0f}   {cpu}{commits}"
    )


def _header(title: str) -> None:
    print(f"\n== {title} ==")
    print(
        f"  {'scenario':<40}{'calls':>7}{'p50':>11}{'p90':>11}{'p99':>11}{'max':>11}"
        f"{'per s':>12}   CPU us/call"
    )


async def part1(args: argparse.Namespace, work: Path) -> None:
    n = args.decisions or (2_000 if args.quick else 20_000)
    print(
        f"\n#### part 1: new-group decisions from a REMOTE node: {n:,} distinct new groups per "
        f"scenario, in flight {' and '.join(map(str, CONCURRENCY))}; REMOTE handler in this "
        f"process (pid {os.getpid()})"
    )
    (work / "local").mkdir()
    f50, f99 = fsync_ms(work / "local", 200)
    print(
        f"fsync before (4 KiB append + fsync in the data dir): p50 {f50:.2f} ms, p99 {f99:.2f} ms"
    )
    results: dict[str, Stats] = {}
    node_results: dict[str, Stats] = {}
    with ExitStack() as stack:
        # A real node with a cluster section (no peers) and the LOCAL grouping handler.
        lone = None if args.no_node else stack.enter_context(running_nodes(work / "node", 1, True))
        node = lone[0] if lone else None
        local = LocalProcess(work / "local")
        stack.callback(local.stop)
        await local.start()
        assert local.proc.pid is not None
        remote = Remote(local.address, {"LOCAL": local.proc.pid})
        await remote.start()
        try:
            for c in CONCURRENCY:  # interleaved, so drifting machine load hits both alike
                results[f"remote new {c}"] = await remote.new(f"r{c}", n, c)
                results[f"local new {c}"] = await local.run("new", f"l{c}", n, c)
            results["remote hit"] = await remote.hit(f"r{CONCURRENCY[0]}", n)
            results["local hit"] = await local.run("hit", f"l{CONCURRENCY[0]}", n)
            results["remote cached"] = remote.cached(f"r{CONCURRENCY[0]}", n)
            results["local cached"] = await local.run("cached", f"l{CONCURRENCY[0]}", n)
        finally:
            await remote.stop()
        local.stop()
        why = ""
        if node is not None:
            assert node.cluster is not None
            why = await serves_grouping(node.cluster)
            if not why:
                remote = Remote(node.cluster, {"node": node.pid})
                await remote.start()
                try:
                    for c in CONCURRENCY:
                        node_results[f"new {c}"] = await remote.new(f"n{c}", n, c)
                    node_results["hit"] = await remote.hit(f"n{CONCURRENCY[0]}", n)
                finally:
                    await remote.stop()

    _header(f"LOCAL handler on a grpc.aio server in its own process ({local.address})")
    for c in CONCURRENCY:
        _row(f"REMOTE decide, new group, {c} in flight", results[f"remote new {c}"])
    _row("REMOTE decide, bound key (cache hit)", results["remote hit"])
    _row("REMOTE cached(), bound key", results["remote cached"])
    for c in CONCURRENCY:
        _row(f"LOCAL decide, new group, {c} in flight", results[f"local new {c}"])
    _row("LOCAL decide, bound key", results["local hit"])
    _row("LOCAL cached(), bound key", results["local cached"])

    if node is not None and why:
        print(
            f"\nreal node: skipped, {node.node_id}'s listen.cluster ({node.cluster}) does not "
            f"answer GroupingHandler.Propose ({why})"
        )
    elif node is not None:
        _header(
            f"LOCAL handler in a real `pinmq node` (cluster section, LOCAL grouping handler, "
            f"listen.cluster {node.cluster})"
        )
        for c in CONCURRENCY:
            _row(f"REMOTE decide, new group, {c} in flight", node_results[f"new {c}"])
        _row("REMOTE decide, bound key (cache hit)", node_results["hit"])

    f50, f99 = fsync_ms(work, 200)
    print(f"\nfsync after: p50 {f50:.2f} ms, p99 {f99:.2f} ms")
    print("\nratios (same run):")
    hit = results["remote hit"]
    for c in CONCURRENCY:
        r, loc = results[f"remote new {c}"], results[f"local new {c}"]
        print(
            f"  {c:>2} in flight: REMOTE / LOCAL new-group decision p50 "
            f"{r.pct(0.5) / loc.pct(0.5):.2f}x, p99 {r.pct(0.99) / loc.pct(0.99):.2f}x, "
            f"decisions/s {r.rate / loc.rate:.2f}x; REMOTE new group / REMOTE cache hit p50 "
            f"{r.pct(0.5) / hit.pct(0.5):,.0f}x"
        )
        if f"new {c}" in node_results:
            x = node_results[f"new {c}"]
            print(
                f"  {c:>2} in flight: real node / own-process LOCAL, REMOTE decision p50 "
                f"{x.pct(0.5) / r.pct(0.5):.2f}x, p99 {x.pct(0.99) / r.pct(0.99):.2f}x"
            )
    for c in CONCURRENCY:
        rows = [("own-process LOCAL", results[f"remote new {c}"])]
        if f"new {c}" in node_results:
            rows.append(("real node", node_results[f"new {c}"]))
        for where, s in rows:
            p99 = s.pct(0.99) / 1e6
            verdict = "MET" if p99 < TARGET_P99_MS else "NOT MET"
            print(
                f"target REMOTE new-group p99 < {TARGET_P99_MS:.0f} ms, {c} in flight, {where}: "
                f"{p99:.2f} ms -> {verdict}"
            )


# ---- part 2 -------------------------------------------------------------------------------------


KINDS = ("grouped", "ungrouped", "bare")  # bare: ungrouped without headers


@dataclass(slots=True)
class Compared:
    """Best-of-R outcomes per (persistent, kind)."""

    runs: dict[tuple[bool, str], list[Outcome]]
    node_id: str

    def best(self, persistent: bool, kind: str) -> Outcome:
        return max(self.runs[(persistent, kind)], key=lambda o: o.e2e_rate)

    def cpu_per_msg(self, persistent: bool, kind: str) -> float:
        """Lowest CPU of the sending node per message over the runs (us)."""
        return (
            min(o.node_cpu[self.node_id].total / o.total for o in self.runs[(persistent, kind)])
            * 1e6
        )


async def compare(
    nodes: Sequence[NodeProc],
    via: NodeProc,
    queue: str,
    groups: tuple[str, ...],
    args: argparse.Namespace,
    label: str,
) -> Compared:
    """M messages of each kind through `via`, consumers on `via` only, the order rotating."""
    m = args.messages or (4_000 if args.quick else 20_000)
    repeat = args.repeat or (1 if args.quick else 5)
    hosts = [Host(via, [f"c{i + 1}" for i in range(3)])]
    settle = SETTLE_S if len(nodes) > 1 else 0.0
    runs: dict[tuple[bool, str], list[Outcome]] = {}
    for persistent in (True, False):
        for r in range(repeat):
            for kind in KINDS[r % 3 :] + KINDS[: r % 3]:
                grouped = kind == "grouped"
                plan = Plan(
                    via.url, via.node_id, 0, m, groups if grouped else (), pad=kind == "ungrouped"
                )
                o = await run_load(nodes, queue, [plan], hosts, persistent, args, settle)
                if not o.ok:
                    bad = {k: why for k, (ok, why) in o.checks.items() if not ok}
                    raise RuntimeError(f"{label}: a run failed its checks: {bad}")
                runs.setdefault((persistent, kind), []).append(o)
                mode = "persistent" if persistent else "non-persistent"
                print(
                    f"  {label}, {mode}, {kind:<9} round {r + 1}/{repeat}: "
                    f"{o.e2e_rate:>8,.0f} msg/s end-to-end, {o.send_rate:>8,.0f} send, "
                    f"{o.node_cpu[via.node_id].total / o.total * 1e6:.0f} us {via.node_id} CPU/msg"
                )
    return Compared(runs, via.node_id)


async def bound_to(node: NodeProc, queue: str, groups: Sequence[str]) -> str:
    """A line saying where the LOCAL handler has `groups` bound (Admin.ClusterGroups)."""
    async with aio.insecure_channel(node.url) as channel:
        stub = cpb_grpc.AdminStub(channel)
        try:
            reply = await stub.ClusterGroups(cpb.ClusterGroupsRequest(queue=queue), timeout=10)
        except aio.AioRpcError as err:
            return f"unknown (ClusterGroups: {err.code().name})"
    wanted = set(groups)
    where: dict[str, int] = {}
    for g in reply.groups:
        if g.bound and g.group in wanted:
            where[g.node] = where.get(g.node, 0) + 1
    return ", ".join(f"{k}: {v}" for k, v in sorted(where.items())) or "none"


def _report(c: Compared, title: str) -> tuple[float, float]:
    """Print the table; the worst mode's cost by end-to-end msg/s and by node CPU per message.

    The cost is grouped against ungrouped messages with the same headers; bare messages (no
    headers) show apart what carrying the two headers costs.
    """
    print(f"\n== {title} ==")
    print(f"  {'mode':<16}{'kind':<11}{'e2e msg/s':>10}{'send msg/s':>11}{'CPU us/msg':>11}")
    costs, cpu_costs = [], []
    for persistent in (True, False):
        mode = "persistent" if persistent else "non-persistent"
        for kind in KINDS:
            o = c.best(persistent, kind)
            print(
                f"  {mode:<16}{kind:<11}{o.e2e_rate:>10,.0f}"
                f"{o.send_rate:>11,.0f}{c.cpu_per_msg(persistent, kind):>11.0f}"
            )
        g, u, b = (c.best(persistent, kind) for kind in KINDS)
        ratio = g.e2e_rate / u.e2e_rate
        cpu = c.cpu_per_msg(persistent, "grouped") / c.cpu_per_msg(persistent, "ungrouped")
        costs.append(1 - ratio)
        cpu_costs.append(cpu - 1)
        print(
            f"  {mode}: grouped / ungrouped end-to-end {ratio:.2f} (cost {1 - ratio:+.1%}), "
            f"send {g.send_rate / u.send_rate:.2f}, {c.node_id} CPU per message {cpu:.2f}x; "
            f"ungrouped / bare (two headers) end-to-end {u.e2e_rate / b.e2e_rate:.2f}"
        )
    return max(costs), max(cpu_costs)


async def part2(args: argparse.Namespace, work: Path) -> None:
    g = args.groups
    groups = tuple(group_name(i) for i in range(g))
    print(
        f"\n#### part 2: cached grouped routing vs ungrouped on one node: "
        f"{args.messages or (4_000 if args.quick else 20_000):,} messages per run, {g} groups "
        f"bound beforehand, 1 producer process, 3 consumers in 1 process, best of "
        f"{args.repeat or (1 if args.quick else 5)} rounds"
    )
    with running_nodes(work / "cluster", NODES, clustered=True) as nodes:
        print(f"cluster: {await wait_formed(nodes)}")
        await probe_send_path(nodes)
        print(
            "send path: grouped messages sent through node1 (LOCAL) and node2 (REMOTE) reach node3"
        )
        via = nodes[1]
        queue = f"route-{uuid.uuid4().hex[:6]}"
        await create_everywhere(nodes, queue)
        hosts = [Host(via, [f"c{i + 1}" for i in range(3)])]
        prebind = Plan(via.url, via.node_id, 0, g, groups)
        o = await run_load(nodes, queue, [prebind], hosts, True, args, SETTLE_S)
        if not o.ok:
            raise RuntimeError(f"binding the groups failed its checks: {o.checks}")
        print(f"groups bound (LOCAL handler, ClusterGroups): {await bound_to(via, queue, groups)}")
        clustered = await compare(nodes, via, queue, groups, args, f"cluster {via.node_id}")
        await delete_everywhere(nodes, queue)
    with running_nodes(work / "standalone", 1, clustered=False) as nodes:
        queue = f"route-{uuid.uuid4().hex[:6]}"
        await create_everywhere(nodes, queue)
        warmup = Plan(nodes[0].url, nodes[0].node_id, 0, g, groups)  # as the binding run above
        hosts = [Host(nodes[0], [f"c{i + 1}" for i in range(3)])]
        await run_load(nodes, queue, [warmup], hosts, True, args, 0.0)
        single = await compare(nodes, nodes[0], queue, groups, args, "standalone")
        await delete_everywhere(nodes, queue)

    cost = _report(
        clustered,
        f"through {clustered.node_id} (REMOTE) of a 3-node cluster, groups bound to "
        f"{clustered.node_id} and cached there",
    )
    base = _report(single, "baseline: one standalone node (no cluster, no grouping handler)")
    print("\nratios (same run):")
    for persistent in (True, False):
        mode = "persistent" if persistent else "non-persistent"
        rc, rs = (
            c.best(persistent, "grouped").e2e_rate / c.best(persistent, "ungrouped").e2e_rate
            for c in (clustered, single)
        )
        ug = (
            clustered.best(persistent, "ungrouped").e2e_rate
            / single.best(persistent, "ungrouped").e2e_rate
        )
        print(
            f"  {mode}: grouped/ungrouped cluster {rc:.2f} vs standalone {rs:.2f} (the cluster's "
            f"own share {rc / rs:.2f}); ungrouped cluster node / standalone node {ug:.2f}"
        )
    for what, mine, theirs in (
        ("end-to-end msg/s, best of the rounds", cost[0], base[0]),
        (f"{clustered.node_id} CPU per message, least of the rounds", cost[1], base[1]),
    ):
        verdict = "MET" if mine < TARGET_COST else "NOT MET"
        print(
            f"target cached grouped routing < {TARGET_COST:.0%} costlier than ungrouped on the "
            f"same node, by {what}, worse mode: {mine:+.1%} -> {verdict} (standalone node: "
            f"{theirs:+.1%})"
        )


# ---- main ---------------------------------------------------------------------------------------


async def amain(args: argparse.Namespace) -> int:
    print(
        f"pinmq cluster decisions; machine: {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.2f} at start"
    )
    with tempfile.TemporaryDirectory(prefix="pinmq-decisions-") as tmp:
        work = Path(tmp)
        if args.part in ("1", "both"):
            await part1(args, work)
        if args.part in ("2", "both"):
            try:
                await part2(args, work)
            except ClusterNotWorking as err:
                print(f"\npart 2 not run: the cluster is not working: {err}")
                return 2
    print(f"\nload average {os.getloadavg()[0]:.2f} at end")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one round")
    parser.add_argument("--part", choices=("1", "2", "both"), default="both")
    parser.add_argument("--decisions", type=int, metavar="N", help="new groups per scenario")
    parser.add_argument("--messages", type=int, metavar="M", help="messages per part-2 run")
    parser.add_argument("--groups", type=int, default=100, help="groups in part 2 (100)")
    parser.add_argument("--repeat", type=int, help="part-2 rounds (5; --quick 1)")
    parser.add_argument(
        "--no-node",
        action="store_true",
        help="part 1: skip the LOCAL handler in a real node (its own process always runs)",
    )
    add_load_args(parser)
    args = parser.parse_args()
    logs.configure(REMOTE_NODE, "warning", "console")  # the handlers' info lines: not here
    run_main(lambda: asyncio.run(amain(args)))


if __name__ == "__main__":
    main()
