"""The checker job: read a history, run every check, gather counts, examples and statistics."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import checks, stats
from pipeline.history import History, load

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

VIOLATIONS = ("lost", "duplicates", "order", "exclusivity", "routing")
EXAMPLES = 20  # violations listed per kind (with their events) in the summary and report
EVENT_COLUMNS = (
    "ts_ns", "n", "node", "epoch", "kind", "msg_id", "key", "queue", "group", "group_seq",
    "consumer", "delivery_count", "target", "new_proposal", "reason",
)  # fmt: skip


@dataclass
class Result:
    history: History
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # example key -> events
    stats: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not any(self.counts.values())

    def summary(self) -> dict[str, Any]:
        return {
            "verdict": "clean" if self.clean else "violations",
            "violations": self.counts,
            "examples": self.examples,
            "example_events": self.events,
            "input": self.history.to_json(),
            "warnings": self.history.warnings(),
            "notes": self.notes,
            "stats": self.stats,
            "seconds": round(self.seconds, 3),
        }


def run(
    spark: SparkSession,
    directory: str | Path,
    *,
    with_stats: bool = True,
    examples: int = EXAMPLES,
    cache: str | Path | None = None,
) -> Result:
    """Check the history under `directory` (HistoryError for unusable input); `cache`: a
    directory where its parsed events are kept for the next check (pipeline/cache.py)."""
    from pyspark import StorageLevel
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    started = time.monotonic()
    history = load(spark, directory, cache)
    result = Result(history)
    events = history.events
    cons = checks.consumption(events, node_deliveries=history.visible.get("delivered", 0) > 0)
    keep = StorageLevel.MEMORY_AND_DISK
    run_ends = history.run_ends()
    routed = checks.routed_events(events).persist(keep)
    deliveries = checks.per_message(cons, run_ends).persist(keep)
    moved = checks.moved_keys(events) if history.kinds.get("moved") else None
    breaks = checks.order(deliveries, moved).persist(keep)
    found = {
        "lost": checks.lost(events),
        "duplicates": checks.duplicates(deliveries),
        "order": breaks.filter(~F.col("accepted")).drop("accepted"),
        "exclusivity": checks.exclusivity(deliveries),
        "routing": checks.routing(routed, events, unbound=history.kinds.get("unbound", 0) > 0),
    }
    cached = [df.persist(keep) for df in found.values()]
    # One job counts every kind, so Spark runs the checks' independent stages side by side;
    # examples are fetched only for the kinds that found something.
    counts = functools.reduce(
        DataFrame.unionByName,
        [
            df.agg(F.count(F.lit(1)).alias("n")).select(F.lit(k).alias("kind"), "n")
            for k, df in found.items()
        ],
    ).collect()
    result.counts = {kind: 0 for kind in VIOLATIONS} | {r["kind"]: int(r["n"]) for r in counts}
    for kind in VIOLATIONS:
        listed = found[kind].limit(examples)
        if kind == "lost":  # counted by key alone; the details only for those listed
            listed = checks.lost_details(events, listed)
        rows = listed.collect() if result.counts[kind] else []
        result.examples[kind] = [r.asDict(recursive=True) for r in rows]
    kinds = history.kinds
    if not kinds.get("client_sent"):
        result.notes.append("no client_sent events (clients did not audit): loss not checked")
    if not kinds.get("routed"):
        result.notes.append("no routed events: routing consistency not checked")
    result.events = _example_events(events, result.examples)
    if with_stats:
        result.stats = {
            "events": kinds,
            **stats.compute(events, deliveries, routed, history.runs),
        }
        if moved is not None:
            result.stats["moved"] = stats.moves(events, breaks)
    for df in [*cached, breaks, deliveries, routed]:
        df.unpersist()
    history.table.unpersist()
    result.seconds = time.monotonic() - started
    return result


def _example_events(events: Any, examples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The events behind the listed violations: by message key, and by group for routing."""
    from pyspark.sql import functions as F

    keys = {
        k
        for kind in ("lost", "duplicates", "order", "exclusivity")
        for ex in examples[kind]
        for k in (ex.get("key"), ex.get("before_key"))
        if k
    }
    groups = {(ex["address"], ex["group"]) for ex in examples["routing"]}
    broken = {
        (ex.get("queue"), ex.get("group"))
        for kind in ("order", "exclusivity", "duplicates")
        for ex in examples[kind]
        if ex.get("group") is not None
    }
    if not keys and not groups:
        return {}
    cond = F.col("key").isin(*keys) if keys else F.lit(False)
    if groups:
        routed = F.col("kind") == "routed"
        cond = cond | (routed & F.col("group").isin(*{g for _, g in groups}))
    if broken:  # what explains a broken group: its binding removals and moves
        changes = F.col("kind").isin("unbound", "moved")
        cond = cond | (changes & F.col("group").isin(*{g for _, g in broken}))
    rows = (
        events.filter(cond)
        .select(*EVENT_COLUMNS, "address")
        .orderBy("ts_ns", "n")
        .limit(5000)
        .collect()
    )
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        d = {k: v for k, v in r.asDict().items() if v is not None}
        if r["kind"] == "routed" and (r["address"], r["group"]) in groups:
            out.setdefault(f"group {r['address']}/{r['group']}", []).append(d)
        if r["key"] in keys:
            out.setdefault(r["key"], []).append(d)
        if r["kind"] in ("unbound", "moved") and (r["queue"], r["group"]) in broken:
            out.setdefault(f"bindings {r['queue']}/{r['group']}", []).append(d)
    return out
