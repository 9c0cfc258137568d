"""What TLS and security (users, passwords, permissions) cost, against a plain node, in one run.

Issue 27 put TLS on every listener and a user, a password and per-address permissions on every
connection. This script measures what that costs a client, so that the price of turning it on
is a figure and not a guess (the issue's target: under 20 % of throughput). It starts three
`pinmq node` processes side by side (temp dirs for data, certificates and the users file,
reserved loopback ports; all stopped on exit, error, Ctrl-C or SIGTERM):

- plain: no `tls`, no `security` (the baseline of every ratio);
- tls: `tls` (a development CA from `pinmq.certs`, `client-auth: none`), no `security`;
- secure: `tls` and `security` on (a users file with `admin`, argon2id; the default roles give
  `admin` every permission), every client logged in as `admin`.

Each figure is measured on the variants in turns (the order rotates every round), so that all
three see the same background load, and printed with its ratio to plain from the same run:

1. gRPC throughput: bench/end_to_end.py's scenario (one producer process streaming persistent
   messages over 100 groups with send_many, 3 consumers acking with ack_many, verified
   exactly-once and in order), end-to-end msg/s. Connection set-up, the password check
   included, stays out of the timed region as it does for plain connections.
2. STOMP throughput: bench/stomp_vs_activemq.py's "concurrent" scenario (stomp.py, 1 producer,
   3 consumers, client-individual acks, 100 groups), consume msg/s.
3. Connection set-up, median and p99 of sequential connects: gRPC `Client.connect` plus the
   first call (which carries the password check: a returning user's, so a keyed digest, not
   argon2id, which the node runs only the first time it sees a password), STOMP from the
   TCP connect through the TLS handshake to CONNECTED (CONNECT carries login and passcode).
4. The permission check per message: `Access.check("send", address)` with 50 address
   patterns, in this process: a cached answer against a first one (most specific pattern).
5. A burst of wrong passwords: STOMP CONNECTs with a wrong passcode from concurrent TLS sockets
   (a separate process) while a connected gRPC client of the secure node sends and consumes:
   that client's msg/s during the burst against before and after it, how long the node took to
   refuse the whole burst, how its answers spread in time (the node refuses a password check
   beyond 16 waiting from one host at once; the others wait for its one argon2 thread), and
   whether a right password, tried every half second meanwhile, gets in.

The harness's clients (bench/harness, bench/stomp_load) speak TLS and log in as each node's
`harness.reach.Reach` says. The parts live in bench/security_parts: the nodes
(`variants`), 1 and 2 (`throughput`), 3 (`connection_setup`), 4 (`permission_check`) and 5
(`burst`).

Default: 5 throughput rounds (gRPC 12,000 and STOMP 6,000 messages a run), 50 set-ups per
kind, two bursts of 1,000; `--quick`: 2 rounds of 4,000 and 2,000, 20 set-ups, one burst.

Usage: python bench/security.py [--quick] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.load import add_load_args
from harness.procs import run_main
from security_parts.burst import Burst, argon2_seconds, burst, print_burst
from security_parts.connection_setup import Setup, print_setups, setup_times
from security_parts.permission_check import permission_check_ns, print_permission_check
from security_parts.throughput import Rates, grpc_throughput, print_throughputs, stomp_throughput
from security_parts.variants import USER, running_variants


@dataclass(slots=True)
class Sizes:
    """How much of each part one run does."""

    grpc_messages: int
    stomp_messages: int
    rounds: int
    setups: int
    check_repeats: int
    bursts: int
    burst_count: int = 1_000
    concurrency: int = 100
    quiet_s: float = 3.0


def sizes(args: argparse.Namespace) -> Sizes:
    """The sizes `--quick` and `--rounds` ask for."""
    if args.quick:
        s = Sizes(4_000, 2_000, 2, 20, 3, 1, quiet_s=2.0)
    else:
        s = Sizes(12_000, 6_000, 5, 50, 7, 2)
    if args.rounds:
        s.rounds = args.rounds
    return s


def report(
    sz: Sizes,
    argon2_s: float,
    grpc: Rates,
    stomp_rates: Rates,
    setups: dict[str, Setup],
    checks: dict[str, tuple[float, float]],
    bursts: list[Burst],
) -> None:
    """The summary of every part."""
    print("\n== summary (medians over rounds; ratio = variant / plain, same run) ==")
    print_throughputs(grpc, stomp_rates, sz.grpc_messages, sz.stomp_messages, sz.rounds)
    print_setups(sz.setups, setups)
    print_permission_check(checks)
    for i, b in enumerate(bursts, 1):
        print_burst(i, b, sz.burst_count, sz.concurrency, argon2_s)


async def measure(args: argparse.Namespace) -> bool:
    """Start the three nodes, run the five parts, print the summary; whether all checks passed."""
    sz = sizes(args)
    print(
        f"pinmq TLS and security against plain: nodes plain / TLS / TLS + security (user "
        f"{USER}, argon2id), one each, side by side; {sz.rounds} rounds, variants in turns"
    )
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pinmq-security-") as tmp:
        work = Path(tmp)
        with running_variants(work) as variants:
            argon2_s = argon2_seconds(work / "users.yaml")
            print(f"one argon2id check in this process: {argon2_s * 1e3:.0f} ms")
            print("\n1. gRPC throughput", flush=True)
            grpc = await grpc_throughput(variants, sz.grpc_messages, sz.rounds, args)
            print("\n2. STOMP throughput", flush=True)
            stomp_rates = stomp_throughput(variants, sz.stomp_messages, sz.rounds)
            print("\n3. connection set-up", flush=True)
            setups = await setup_times(variants, sz.setups)
            print("\n4. permission check", flush=True)
            checks = permission_check_ns(sz.check_repeats)
            print("\n5. a burst of wrong passwords", flush=True)
            secure = variants["secure"]
            bursts = [
                await burst(secure, sz.burst_count, sz.concurrency, sz.quiet_s)
                for _ in range(sz.bursts)
            ]
            shed = "password checks refused" in secure.node.log_path.read_text()
    report(sz, argon2_s, grpc, stomp_rates, setups, checks, bursts)
    print(f"  node log says 'password checks refused': {shed}")
    for note in grpc.notes + stomp_rates.notes:
        print(f"FAILED CHECK {note}")
    ok = grpc.ok and stomp_rates.ok
    print(
        f"\nload average {os.getloadavg()[0]:.2f} at end; {time.monotonic() - t_start:.0f} s; "
        f"all checks {'PASS' if ok else 'FAIL'}"
    )
    return ok


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="smaller runs: 2 rounds, 20 set-ups, one burst"
    )
    parser.add_argument("--rounds", type=int, metavar="R", help="throughput rounds per variant")
    add_load_args(parser)
    parser.set_defaults(layout="shared")  # end_to_end.scenario's: one process, 3 consumers
    return parser


def main() -> None:
    args = parser().parse_args()
    run_main(lambda: asyncio.run(measure(args)))


if __name__ == "__main__":
    main()
