"""A seeded chaos run (tests/chaos_run.py) of any length, for issue 30's availability figures.

The compose cluster with every node paired (docker-compose.ha-all.yml, six containers; the
image built as `make up` builds it, as pinmq:test or $PINMQ_TEST_IMAGE), the drills' audited
grouped load, and the nemesis's schedule for `--seed` over `--minutes` (tests/nemesis.py: kills,
pauses and network cuts of one container or two at once, whole-stack restarts, overlapping;
a container's data disk filled and freed).
It prints the schedule first, each fault as it starts, then `pinmq check`'s verdict and the
availability of every group: its longest stall, the share of the run it was served, and the
faults that held during that stall. A failing seed prints its schedule and the command that
replays it; the exit status is 1 then. The project (its containers, network and volumes) is
removed at the end, pass or fail; the audit history, the report and the containers' logs
stay in `--workdir` (default: a fresh temporary directory, printed).

Usage: .venv/bin/python bench/chaos.py [--minutes M] [--seed S] [--workdir DIR] [--json FILE]
(`make chaos MINUTES=30 SEED=...`)
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import tempfile
from pathlib import Path

import pytest
from harness.procs import run_main  # puts tests/ on sys.path: chaos_run, compose_nodes are there


def main() -> bool:
    from chaos_run import chaos, table
    from compose_nodes import IMAGE, build_image

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="faults and availability, as JSON")
    args = parser.parse_args()
    faulthandler.enable()  # a crash of the runner (its TLS clients, say) prints every thread
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pinmq-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"chaos: seed {args.seed}, {args.minutes:g} min, in {workdir}", flush=True)
    image = build_image(IMAGE)
    with pytest.MonkeyPatch.context() as monkeypatch:
        run, stats = asyncio.run(
            chaos(workdir, image, monkeypatch, args.seed, args.minutes * 60, _say)
        )
    rows = run.availability(stats)
    print(f"pinmq check: clean; {len(run.applied)} faults, {run.replaced} consumers replaced")
    print(table(rows))
    worst = max(rows, key=lambda r: r["longest_stall_ms"])
    least = min(r["served"] for r in rows)
    print(
        f"longest stall of any group: {worst['longest_stall_ms'] / 1000:.2f} s ({worst['group']});"
        f" least served group: {least:.1%}"
    )
    if args.json is not None:
        faults = [
            {"fault": a.fault.describe().strip(), "start_ns": a.start_ns, "end_ns": a.end_ns}
            for a in run.applied
        ]
        summary = {"seed": args.seed, "planned": len(run.faults), "faults": faults, "groups": rows}
        args.json.write_text(json.dumps(summary, indent=1))
    return True


def _say(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    run_main(main)
