"""What every drill shares: consumers that ack as they go while holding a few deliveries out,
and the verdict of `pinmq check` on the collected audit history (tests/drills/test_drills.py on a
three-node cluster, tests/ha/test_ha.py on the LOCAL node's pair)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import PINMQ

from broker.client import Client, ConnectionLost, PinmqError, Received

HOLD = 8  # each consumer keeps its newest deliveries unacked, so a kill finds some out


@dataclass
class Worker:
    """One consumer that acks all but its newest `hold` deliveries as it goes.

    With `failover` its client moves to another address when its node goes: deliveries from
    before the move can no longer be acked (the node delivers them again), so they are
    dropped instead of ending the worker.
    """

    name: str
    hold: int = HOLD
    failover: bool = False
    acked: set[bytes] = field(default_factory=set)  # bodies: msg ids are per node
    held: list[Received] = field(default_factory=list)
    unsure: set[bytes] = field(default_factory=set)  # acks in flight when the node died
    replaced: bool = False  # its client gave up, another worker took its place (chaos run)
    task: asyncio.Task[None] | None = None

    async def run(self, client: Client, queue: str, drain: asyncio.Event) -> None:
        async with client.consumer(queue, name=self.name, prefetch=self.hold + 4) as consumer:
            while True:
                m = await consumer.receive(timeout=0.2)
                if m is not None:
                    self.held.append(m)
                if len(self.held) > self.hold or (drain.is_set() and self.held):
                    oldest = self.held.pop(0)
                    try:
                        await oldest.ack(wait=True)
                    except ConnectionLost:
                        if not self.failover:
                            raise
                        continue  # received before the move: it comes again
                    except PinmqError:
                        self.unsure.add(oldest.body)  # committed or not: redelivered if not
                        if not self.failover:
                            raise
                        continue
                    self.acked.add(oldest.body)


async def check(history: Path, report: Path) -> tuple[dict[str, Any], str]:
    """`pinmq check` on the history, as a user runs it: its summary and its output."""
    done = await asyncio.to_thread(
        subprocess.run,
        [*PINMQ, "check", str(history), "--master", "local[2]", "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stderr
    return json.loads((report / "summary.json").read_text()), done.stdout


async def clean_check(history: Path, report: Path) -> dict[str, Any]:
    """Require `pinmq check` to find no loss, duplicate, order or exclusivity violation (nor
    any other kind it counts); its stats."""
    summary, output = await check(history, report)
    counts = summary["violations"]
    assert {"lost", "duplicates", "order", "exclusivity"} <= counts.keys(), counts
    assert counts == {k: 0 for k in counts}, output
    assert "verdict: CLEAN" in output
    return summary["stats"]
