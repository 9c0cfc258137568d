"""Three-node cluster throughput of grouped persistent messages, against one node in the same run.

The script starts a 3-node cluster of real `pinmq node` processes (free loopback ports,
temporary data dirs, cluster + grouping-handler sections, node1 LOCAL, node2/node3 REMOTE),
checks that a grouped message sent through a REMOTE node reaches a consumer on another node
(else it stops with a clear message: the cluster send path is not working), then runs the load:
one producer process per node sending grouped persistent messages (JMSXGroupID, 100 B bodies
carrying producer, sequence and send time) with `send_many`, and one consumer process per
node hosting that node's consumers (prefetch 100, `ack_many`).

Cluster variants (`--variants`, both by default, each on a fresh cluster):
- `on-demand`: `load-balancing: ON_DEMAND`; every producer sends to every group, each starting
  at a different third of the groups. A new group is proposed round robin over the instances
  with consumers, so groups are bound evenly over the nodes and about 2/3 of the messages are
  forwarded by store-and-forward to the node their group is bound to.
- `off`: `load-balancing: OFF`; each producer sends only its own third of the groups, which
  are bound to its own node: nothing is forwarded (the cluster's best case).
Then the same load (3 producer processes, 3 consumer processes, the same consumers) runs
against one standalone node, and the ratio cluster / standalone is printed.

Every run verifies exactly-once (every (producer, seq) delivered once, no redelivery, queues
and store-and-forward queues empty after), per-group order (each producer's messages of a
group arrive in the order sent) and one consumer per group cluster-wide. Every process the
script starts is stopped on exit, error, Ctrl-C or SIGTERM. No timing is asserted.

Usage: python bench/cluster_throughput.py [--quick | --messages N] [--groups G]
       [--variants on-demand off] [--consumers-per-node C] [--non-persistent]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import uuid
from pathlib import Path

from harness.clients import BODY_BYTES, Plan
from harness.load import Host, Outcome, add_load_args, hosts_for, plans_for, print_outcome, run_load
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
from harness.procs import run_main

NODES = 3
CONSUMERS_PER_NODE = 2


async def amain(args: argparse.Namespace) -> bool:
    n = args.messages or (6_000 if args.quick else 30_000)
    mode = "non-persistent" if args.non_persistent else "persistent"
    per_node = args.consumers_per_node
    print(
        f"pinmq cluster throughput: {n:,} {mode} grouped messages per run over {args.groups} "
        f"groups, {BODY_BYTES} B bodies, {NODES} producer processes (send_many {args.batch} x "
        f"window {args.window}), {per_node * NODES} consumers in {NODES} processes "
        f"(prefetch {args.prefetch}, ack_many)"
    )
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    persistent = not args.non_persistent
    ok = True
    best: dict[str, Outcome] = {}

    async def runs(label: str, nodes: list[NodeProc], plans: list[Plan], hosts: list[Host]) -> None:
        nonlocal ok
        settle = SETTLE_S if len(nodes) > 1 else 0.0
        for r in range(1, args.repeat + 1):
            queue = f"tp-{uuid.uuid4().hex[:8]}"
            await create_everywhere(nodes, queue)
            o = await run_load(nodes, queue, plans, hosts, persistent, args, settle)
            await delete_everywhere(nodes, queue)
            ok &= o.ok
            print_outcome(f"{label}" + (f" (run {r}/{args.repeat})" if args.repeat > 1 else ""), o)
            if label not in best or o.e2e_rate > best[label].e2e_rate:
                best[label] = o

    with tempfile.TemporaryDirectory(prefix="pinmq-cluster-") as tmp:
        work = Path(tmp)
        with running_nodes(work / "standalone", 1, clustered=False) as nodes:
            await runs(
                "standalone",
                nodes,
                plans_for(nodes, n, args.groups, own=False),
                hosts_for(nodes, per_node * NODES, NODES),
            )
        for variant in args.variants:
            policy = "OFF" if variant == "off" else "ON_DEMAND"
            with running_nodes(
                work / variant, NODES, clustered=True, load_balancing=policy
            ) as nodes:
                print(f"\ncluster ({variant}): {await wait_formed(nodes)}")
                if policy == "ON_DEMAND":
                    await probe_send_path(nodes)
                    print(
                        "send path: grouped messages sent through node1 (LOCAL) and node2 "
                        "(REMOTE) reach a consumer on node3"
                    )
                await runs(
                    f"cluster {variant}",
                    nodes,
                    plans_for(nodes, n, args.groups, own=variant == "off"),
                    hosts_for(nodes, per_node * NODES, NODES),
                )
    which = f", best of {args.repeat} runs by end-to-end msg/s" if args.repeat > 1 else ""
    print(f"\n== summary{which} ==")
    print(
        f"{'run':<20}{'e2e msg/s':>10}{'send msg/s':>11}{'p50 ms':>8}{'p99 ms':>8}"
        f"{'node CPU/msg':>13}{'fwd':>6}  checks"
    )
    for label, o in best.items():
        print(
            f"{label:<20}{o.e2e_rate:>10,.0f}{o.send_rate:>11,.0f}{o.p50_ms:>8.1f}{o.p99_ms:>8.1f}"
            f"{o.nodes_cpu / o.total * 1e6:>10.0f} us{o.forwarded / o.total:>6.0%}"
            f"  {'PASS' if o.ok else 'FAIL'}"
        )
    single = best["standalone"]
    for label, o in best.items():
        if label == "standalone":
            continue
        cpu = o.nodes_cpu / max(single.nodes_cpu, 1e-9)
        print(
            f"ratio {label} / standalone: {o.e2e_rate / single.e2e_rate:.2f} end-to-end "
            f"({o.e2e_rate:,.0f} / {single.e2e_rate:,.0f} msg/s), "
            f"{o.send_rate / single.send_rate:.2f} send; node CPU per message {cpu:.2f}x"
        )
    print(f"load average {os.getloadavg()[0]:.2f} at end; all checks {'PASS' if ok else 'FAIL'}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="6,000 messages per run")
    size.add_argument("--messages", type=int, metavar="N", help="messages per run (30,000)")
    parser.add_argument("--groups", type=int, default=300, help="groups (300)")
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=("on-demand", "off"),
        default=["on-demand", "off"],
        help="cluster variants to run (both by default; see the module docstring)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per setup; best is kept")
    parser.add_argument("--consumers-per-node", type=int, default=CONSUMERS_PER_NODE, metavar="C")
    parser.add_argument("--non-persistent", action="store_true", help="non-persistent messages")
    add_load_args(parser)
    args = parser.parse_args()

    def body() -> bool | int:
        try:
            return asyncio.run(amain(args))
        except ClusterNotWorking as err:
            print(f"cluster not working: {err}", file=sys.stderr)
            return 2

    run_main(body)


if __name__ == "__main__":
    main()
