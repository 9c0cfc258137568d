"""The same five checks in plain Python, one process, one pass over the files.

A reference for the Spark job (the tests compare their counts) and the baseline of
`bench/checker.py`. Definitions as in `pipeline/checks.py`; malformed lines are skipped.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from broker.audit_schema import KINDS, SEGMENT_RE

SETTLE = ("acked", "rejected")
CONSUMPTION = ("delivered", "acked", "released", "rejected")
CLIENT_AS_NODE = {"client_received": "delivered", "client_acked": "acked"}


def check(directory: str | Path) -> dict[str, int]:
    """Violation counts: lost, duplicates, order, exclusivity, routing."""
    files = sorted(p for p in Path(directory).rglob("*.jsonl") if p.is_file())
    sent: set[str] = set()
    settled_keys: set[str] = set()
    moved: set[str] = set()  # messages a node moved to their group's new binding
    node_msgs: dict[tuple[str, str], list[tuple[Any, ...]]] = defaultdict(list)
    client_msgs: dict[tuple[str, str], list[tuple[Any, ...]]] = defaultdict(list)
    # (queue, group, epoch) -> its routed and unbound events: (ts, n, unbound, target)
    routes: dict[tuple[Any, ...], list[tuple[int, int, bool, Any]]] = defaultdict(list)
    run_end: dict[tuple[str, int], int] = {}
    for path in files:
        m = SEGMENT_RE.match(path.name)
        boot = int(m["boot"]) if m else 0
        with path.open("rb") as f:
            for raw in f:
                try:
                    e = json.loads(raw)
                    ts, node, kind = e["ts_ns"], e["node"], e["kind"]
                except (ValueError, KeyError, TypeError):
                    continue
                if ts is None or node is None or kind not in KINDS:
                    continue
                run = (node, boot)
                if run_end.get(run, -1) < ts:
                    run_end[run] = ts
                key = e.get("mid") or f"{node}:{e.get('msg_id')}"
                queue = e.get("queue")
                internal = queue is not None and queue.startswith("$")
                if kind == "client_sent":
                    sent.add(key)
                elif kind == "client_acked" or (kind in SETTLE and not internal):
                    settled_keys.add(key)
                if kind == "moved":
                    moved.add(key)
                    continue
                if kind in ("routed", "unbound"):
                    if e.get("group") is not None:
                        route = (ts, e.get("n") or 0, kind == "unbound", e.get("target"))
                        routes[(queue, e["group"], e.get("epoch"))].append(route)
                    continue
                if internal:
                    continue
                row = (ts, e.get("n") or 0, kind, node, boot, e.get("consumer"), e.get("group"),
                       e.get("group_seq"), e.get("producer"))  # fmt: skip
                if kind in CONSUMPTION:
                    node_msgs[(queue, key)].append(row)
                elif kind in CLIENT_AS_NODE:
                    client_msgs[(queue, key)].append(row)
    has_node = any(r[2] == "delivered" for rows in node_msgs.values() for r in rows)
    msgs = node_msgs if has_node else client_msgs
    counts = {"lost": len(sent - settled_keys), "duplicates": 0, "order": 0}
    by_group: dict[tuple[Any, ...], list[tuple[int, tuple[int, int] | None, str]]] = defaultdict(
        list
    )
    holds: dict[tuple[str, str], list[tuple[int, int, int, str]]] = defaultdict(list)
    for (queue, key), rows in msgs.items():
        if not has_node:
            rows = [(*r[:2], CLIENT_AS_NODE[r[2]], *r[3:]) for r in rows]
        rows.sort(key=lambda r: (r[0], r[1]))
        settled = min(((r[0], r[1]) for r in rows if r[2] in SETTLE), default=None)
        first = None
        for i, r in enumerate(rows):
            if r[2] != "delivered":
                continue
            if first is None:
                first = r
            if i > 0:
                p = rows[i - 1]
                crash = (p[3], p[4]) != (r[3], r[4]) and run_end.get((p[3], p[4]), 0) < r[0]
                if p[2] not in ("released", "rejected") and not crash:
                    counts["duplicates"] += 1
            group, consumer = r[6], r[5]
            if group is not None and consumer is not None:
                holds[(queue, group)].append((r[0], r[1], 1, consumer))
                nxt = rows[i + 1] if i + 1 < len(rows) else None
                if nxt is not None and nxt[2] in ("acked", "released", "rejected"):
                    holds[(queue, group)].append((nxt[0], nxt[1], -1, consumer))
                elif (end := run_end.get((r[3], r[4]))) is not None:
                    holds[(queue, group)].append((end, 1 << 62, -1, consumer))
        if first is not None and first[6] is not None and (first[7] or 0) > 0:
            by_group[(queue, first[6], first[8])].append((first[7], settled, key))
    for items in by_group.values():
        items.sort(key=lambda x: x[0])
        for (_, before, k1), (_, mine, k2) in itertools.pairwise(items):
            accepted = k1 in moved or k2 in moved  # the order a move changed, by configuration
            if before is not None and mine is not None and mine < before and not accepted:
                counts["order"] += 1
    exclusive = 0
    for events in holds.values():
        events.sort(key=lambda h: (h[0], h[1], h[2]))
        mine: dict[str, int] = defaultdict(int)
        total = 0
        for _, _, delta, consumer in events:
            if delta == 1 and mine[consumer] == 0 and total > 0:
                exclusive += 1
            mine[consumer] += delta
            total += delta
    counts["exclusivity"] = exclusive
    counts["routing"] = sum(_split_bindings(events) for events in routes.values())
    return counts


def _split_bindings(events: list[tuple[int, int, bool, Any]]) -> int:
    """How many of a group's bindings (the routes between two removals) named two targets."""
    events.sort()
    split = 0
    targets: set[Any] = set()
    for _, _, unbound, target in events:
        if unbound:
            split += len(targets) > 1
            targets = set()
        else:
            targets.add(target)
    return split + (len(targets) > 1)
