"""What an ha pair's logs and files say, for bench/ha.py: sizes on disk, replication's
events, and the steps of a takeover as the promoted process logged them."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.nodes import NodeProc


def data_size(node: NodeProc) -> str:
    """store.db and its WAL on disk, MiB."""
    data = node.home / "data"
    db, wal = (data / n for n in ("store.db", "store.db-wal"))
    mib = [p.stat().st_size / 2**20 if p.exists() else 0.0 for p in (db, wal)]
    return f"store.db {mib[0]:.0f} MiB + WAL {mib[1]:.0f} MiB"


def replication_log(primary: NodeProc, backup: NodeProc) -> Counter[str]:
    """What the two logs say of replication so far, counted: the snapshots the primary began
    and sent (how long, how much of it paced), and every reason the backup was dropped or its
    stream broke off."""
    found: Counter[str] = Counter()
    for node in (primary, backup):
        for entry in _entries(node.log_path):
            event = entry.get("event", "")
            if "sending a snapshot" in event:
                found["snapshots begun"] += 1
            elif event == "snapshot sent":
                took, paced = entry.get("took_s"), entry.get("paced_s")
                over = (entry.get(k) for k in ("loop_over_budget", "commits_over_budget"))
                found[
                    f"snapshot sent in {took} s, {paced} s of it resting for the load; "
                    f"of {entry.get('steps')} steps, over budget by loop lateness / commit "
                    f"time: {' / '.join(map(str, over))}"
                ] += 1
            elif "backup lost" in event or "replication from the primary broke off" in event:
                why = entry.get("reason") or entry.get("error")
                found[f"{node.node_id}: {event}: {why}"] += 1
    return found


def takeover_steps(backup: NodeProc, killed_at: float) -> list[tuple[str, float]]:
    """Seconds from the kill (`killed_at`, wall clock) to each step the promoted backup logged:
    its first change of failover state (it stopped hearing the primary), its election, and its
    node started (following stopped, store opened, groups paged)."""
    steps: dict[str, float] = {}
    for entry in _entries(backup.log_path):
        at = datetime.fromisoformat(entry.get("timestamp", "")).timestamp() - killed_at
        if at < 0:
            continue
        event = entry.get("event")
        if event == "failover state":
            steps.setdefault("stood for election", at)
            if entry.get("role") == "active":
                steps.setdefault("elected", at)
        elif event == "node started" and "elected" in steps:
            steps.setdefault(f"node started ({entry.get('restored_from')})", at)
    return list(steps.items())


def _entries(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a node's log (others, such as a traceback's, skipped)."""
    entries = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return entries
