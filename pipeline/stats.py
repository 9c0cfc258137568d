"""Statistics of a history: distribution of messages and groups, decision latency, failover gaps.

Computed with Spark aggregations; only the (small) aggregated results are collected.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

PERCENTILES = (0.5, 0.9, 0.99, 0.999)
TIMELINE_BUCKETS = 120
GAP_BEFORE_S, GAP_AFTER_S = 10.0, 30.0  # where to look for the pause around a failover
END_S = 1.0  # a node run ending less than this before the last delivery is no failover
STALL_S = 1.0  # a group whose next first delivery comes this much later stalled
STALLS_LISTED = 50  # the longest stalls listed in the summary
SLICE_NS = 1_000_000_000  # the span around a failover is sorted in slices this long


def _skew(values: list[int]) -> float | None:
    if not values:
        return None
    mean = sum(values) / len(values)
    return round(max(values) / mean, 3) if mean else None


def _pct(row: Any, name: str) -> dict[str, Any]:
    values = row[name] or []
    names = [f"p{str(p * 100).rstrip('0').rstrip('.')}" for p in PERCENTILES]
    return dict(zip(names, values, strict=False))


def compute(
    events: DataFrame,
    deliveries: DataFrame,
    routed: DataFrame,
    runs: list[tuple[str, int, str, int]],
) -> dict[str, Any]:
    """Everything the summary and report show besides the violations.

    `deliveries` and `routed` come from the job (cached); the heavy part is one aggregation of
    first deliveries per (node, consumer, queue, group), which the distributions derive from.
    The statistics are a dozen small Spark jobs: once that aggregation is cached they are
    submitted side by side from threads, so that one job's scheduling and few-task stages
    overlap the others' work.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    first = deliveries.filter(F.col("first"))
    cells = (
        first.groupBy("node", "consumer", "queue", "group")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.min("ts_ns").alias("lo"),
            F.max("ts_ns").alias("hi"),
        )
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    per_node = (
        cells.groupBy("node")
        .agg(
            F.sum("messages").alias("messages"),
            F.countDistinct("queue", "group").alias("groups"),
            F.countDistinct("consumer").alias("consumers"),
            F.min("lo").alias("lo"),
            F.max("hi").alias("hi"),
        )
        .orderBy("node")
        .collect()
    )
    with ThreadPoolExecutor(max_workers=6, thread_name_prefix="stats") as pool:
        consumers = pool.submit(_per_consumer, events, cells)
        sizes = pool.submit(_group_sizes, cells)
        latency = pool.submit(_decision_latency, routed)
        timeline = pool.submit(_timeline, first, per_node)
        stalls = pool.submit(group_stalls, first)
        changes = pool.submit(binding_changes, events)
        per_consumer = consumers.result()
        out: dict[str, Any] = {
            "per_node": [
                {k: v for k, v in r.asDict().items() if k not in ("lo", "hi")} for r in per_node
            ],
            "per_consumer": per_consumer,
            "skew": {
                "messages_per_node": _skew([r["messages"] for r in per_node]),
                "groups_per_node": _skew([r["groups"] for r in per_node]),
                "messages_per_consumer": _skew([r["messages"] for r in per_consumer]),
                "groups_per_consumer": _skew([r["groups"] for r in per_consumer]),
            },
            "group_sizes": sizes.result(),
            "decision_latency_ms": latency.result(),
            "timeline": timeline.result(),
            "binding_changes": changes.result(),
        }
        out["stalls"] = stalls.result()
        out["failovers"] = failover_gaps(deliveries, routed, runs, out["stalls"]["all"])
        del out["stalls"]["all"]
    cells.unpersist()
    return out


def _per_consumer(events: DataFrame, cells: DataFrame) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    names = (
        events.filter(F.col("consumer_name").isNotNull() & (F.col("kind") == "client_received"))
        .groupBy("consumer")
        .agg(F.first("consumer_name").alias("name"))
        .collect()
    )
    name_of = {r["consumer"]: r["name"] for r in names}
    per_consumer = (
        cells.filter(F.col("consumer").isNotNull())
        .groupBy("node", "consumer")
        .agg(F.sum("messages").alias("messages"), F.count(F.col("group")).alias("groups"))
        .orderBy("node", "consumer")
        .collect()
    )
    return [{**r.asDict(), "name": name_of.get(r["consumer"])} for r in per_consumer]


def _group_sizes(cells: DataFrame) -> dict[str, Any]:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    sizes = (
        cells.filter(F.col("group").isNotNull())
        .groupBy("queue", "group")
        .agg(F.sum("messages").alias("size"))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    size_row = sizes.agg(
        F.count(F.lit(1)).alias("groups"),
        F.min("size").alias("min"),
        F.max("size").alias("max"),
        F.avg("size").alias("mean"),
        F.percentile_approx("size", list(PERCENTILES)).alias("pct"),
    ).first()
    histogram = (
        sizes.groupBy(F.floor(F.log2("size")).cast("int").alias("b")).count().orderBy("b").collect()
    )
    sizes.unpersist()
    return {
        "groups": int(size_row["groups"]),
        "min": size_row["min"],
        "max": size_row["max"],
        "mean": round(size_row["mean"], 3) if size_row["mean"] is not None else None,
        **_pct(size_row, "pct"),
        "histogram": [
            {"from": 2 ** r["b"], "to": 2 ** (r["b"] + 1) - 1, "groups": int(r["count"])}
            for r in histogram
        ],
    }


def _decision_latency(routed: DataFrame) -> dict[str, Any]:
    from pyspark.sql import functions as F

    decisions = routed.filter(F.col("new_proposal") & F.col("decision_ns").isNotNull()).select(
        (F.col("decision_ns") / 1e6).alias("ms")
    )
    bucket = F.floor(F.log2(F.greatest("ms", F.lit(0.001))) * 2).cast("int")
    lat = decisions.agg(
        F.count(F.lit(1)).alias("count"),
        F.max("ms").alias("max"),
        F.percentile_approx("ms", list(PERCENTILES), 10000).alias("pct"),
    ).first()
    lat_hist = decisions.groupBy(bucket.alias("b")).count().orderBy("b").collect()
    return {
        "count": int(lat["count"]),
        "max": lat["max"],
        **_pct(lat, "pct"),
        "histogram": [
            {
                "from_ms": round(2 ** (r["b"] / 2), 4),
                "to_ms": round(2 ** ((r["b"] + 1) / 2), 4),
                "count": int(r["count"]),
            }
            for r in lat_hist
        ],
    }


def _timeline(first: DataFrame, per_node: list[Any]) -> dict[str, Any]:
    """First deliveries per node in `TIMELINE_BUCKETS` slices of the run."""
    from pyspark.sql import functions as F

    lo = min((r["lo"] for r in per_node), default=None)
    hi = max((r["hi"] for r in per_node), default=None)
    timeline: dict[str, Any] = {"start_ns": lo, "end_ns": hi, "series": {}}
    if lo is None or hi is None:
        return timeline
    width = max(1, (hi - lo) // TIMELINE_BUCKETS + 1)
    timeline["bucket_ns"] = width
    b = ((F.col("ts_ns") - F.lit(lo)) / width).cast("long")
    for r in first.groupBy("node", b.alias("b")).count().collect():
        series = timeline["series"].setdefault(r["node"], [0] * TIMELINE_BUCKETS)
        series[min(r["b"], TIMELINE_BUCKETS - 1)] += int(r["count"])
    return timeline


def group_stalls(first: DataFrame) -> dict[str, Any]:
    """Pauses of STALL_S or more between a group's consecutive first deliveries.

    What a consumer of the group lived through, whatever caused it: a node down or frozen
    (a frozen node ends no run, so only this finds it), a group waiting for its node, a
    decision that did not come. `all` lists every stall (for the failover moments), `longest`
    the STALLS_LISTED longest, `per_group` each stalled group's total and longest stall (the
    chaos run's availability, tests/chaos_run.py).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("queue", "group").orderBy("ts_ns")
    stalls = (
        first.filter(F.col("group").isNotNull())
        .select("queue", "group", "node", "ts_ns", F.lag("ts_ns").over(w).alias("prev"))
        .filter(F.col("ts_ns") - F.col("prev") >= int(STALL_S * 1e9))
        .select(
            "queue",
            "group",
            F.col("node").alias("resumed_on"),
            F.col("prev").alias("from_ns"),
            F.col("ts_ns").alias("to_ns"),
        )
        .collect()
    )
    found = sorted(
        ({**r.asDict(), "gap_ms": round((r["to_ns"] - r["from_ns"]) / 1e6, 3)} for r in stalls),
        key=lambda s: -s["gap_ms"],
    )
    per_group: dict[str, dict[str, Any]] = {}
    for s in found:  # longest first: a group's first entry is its longest stall
        g = per_group.setdefault(
            f"{s['queue']}/{s['group']}",
            {
                "stalled_ms": 0.0,
                "longest_ms": s["gap_ms"],
                "longest_from_ns": s["from_ns"],
                "longest_to_ns": s["to_ns"],
            },
        )
        g["stalled_ms"] = round(g["stalled_ms"] + s["gap_ms"], 3)
    return {
        "count": len(found),
        "groups": len(per_group),
        "longest": found[:STALLS_LISTED],
        "per_group": per_group,
        "all": found,
    }


def failover_gaps(
    deliveries: DataFrame,
    routed: DataFrame,
    runs: list[tuple[str, int, str, int]],
    stalls: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Delivery gaps around failovers: a node's run ending while others go on, or a new epoch.

    For each such moment, the longest pause between two deliveries (anywhere in the cluster)
    from `GAP_BEFORE_S` before it to `GAP_AFTER_S` after it, and the groups that stalled
    across it (`stalls`, from `group_stalls`) with the longest of their pauses: what the
    consumers of the node's groups waited, which the cluster-wide gap hides while other nodes
    go on. A node's run that ends without a later run of that node and without any group
    stalling across its end is a node that went quiet (idle), not a failover. `runs`: (node,
    boot, source, run_end) of every writer run.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    epochs = (
        routed.filter(F.col("epoch").isNotNull())
        .groupBy("epoch")
        .agg(F.min("ts_ns").alias("at"))
        .orderBy("epoch")
        .collect()
    )
    # A run that ends when (or just before) the deliveries end is the end of the test, not a
    # failover: only runs the cluster went on delivering well after count.
    last = deliveries.agg(F.max("ts_ns")).first()[0]
    if last is None:
        return []
    starts: dict[str, list[int]] = {}
    for node, boot, source, _ in runs:
        if source == "node":
            starts.setdefault(node, []).append(boot)
    moments = []
    for node, boot, source, end in runs:
        if source != "node" or last - end <= END_S * 1e9:
            continue
        later = [b for b in starts[node] if b > boot]
        if later:  # boot is the next run's start time
            away = (min(later) - end) / 1e9
            moments.append((f"node {node} stopped (back after {away:.1f} s)", end))
        elif _across(stalls, end):
            moments.append((f"node {node} stopped", end))
    moments += [(f"epoch {r['epoch']} began", r["at"]) for r in epochs[1:] if r["at"] < last]
    if not moments:
        return []
    frame = deliveries.sparkSession.createDataFrame(
        [(i, at) for i, (_, at) in enumerate(moments)], "moment int, at long"
    )
    since = F.col("ts_ns") - (F.col("at") - int(GAP_BEFORE_S * 1e9))
    near = (
        deliveries.select("ts_ns")
        .crossJoin(F.broadcast(frame))
        .filter((since >= 0) & (F.col("ts_ns") <= F.col("at") + int(GAP_AFTER_S * 1e9)))
        .select("moment", "ts_ns", F.floor(since / SLICE_NS).alias("slice"))
    )
    # Sorting a moment's deliveries in one task is slow at millions of them: each slice of its
    # span is sorted apart, and the gaps between slices come from their first and last ones.
    w = Window.partitionBy("moment", "slice").orderBy("ts_ns")
    slices = (
        near.select("moment", "slice", "ts_ns", F.lag("ts_ns").over(w).alias("prev"))
        .groupBy("moment", "slice")
        .agg(
            F.min("ts_ns").alias("lo"),
            F.max("ts_ns").alias("hi"),
            F.max_by(F.struct("prev", "ts_ns"), F.col("ts_ns") - F.col("prev")).alias("g"),
        )
        .orderBy("moment", "slice")
        .collect()
    )
    gaps: dict[int, list[tuple[int, int]]] = {}
    hi: dict[int, int] = {}
    for r in slices:
        found = gaps.setdefault(r["moment"], [])
        if r["moment"] in hi:
            found.append((hi[r["moment"]], r["lo"]))
        if r["g"] is not None and r["g"]["prev"] is not None:
            found.append((r["g"]["prev"], r["g"]["ts_ns"]))
        hi[r["moment"]] = r["hi"]
    out = []
    for i, found in gaps.items():
        if found:
            start, stop = max(sorted(found), key=lambda g: g[1] - g[0])
            what, at = moments[i]
            across = _across(stalls, at)
            out.append(
                {
                    "what": what,
                    "at_ns": at,
                    "gap_from_ns": start,
                    "gap_to_ns": stop,
                    "gap_ms": round((stop - start) / 1e6, 3),
                    "groups_stalled": len(across),
                    "group_gap_ms": max((s["gap_ms"] for s in across), default=0.0),
                }
            )
    return sorted(out, key=lambda g: g["at_ns"])


def _across(stalls: list[dict[str, Any]], at: int) -> list[dict[str, Any]]:
    """The group stalls that span the moment `at` (a second either side counts)."""
    slack = int(END_S * 1e9)
    return [s for s in stalls if s["from_ns"] - slack <= at <= s["to_ns"] + slack]


def binding_changes(events: DataFrame) -> list[dict[str, Any]]:
    """Bindings removed (`unbound`, by target and reason) and groups moved (`moved`, by node
    and target), with when they began and ended: the binding side of what happened."""
    from pyspark.sql import functions as F

    changes = (
        events.filter(F.col("kind").isin("unbound", "moved"))
        .groupBy("kind", "node", "target", "reason")
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.countDistinct("queue", "group").alias("groups"),
            F.min("ts_ns").alias("from_ns"),
            F.max("ts_ns").alias("to_ns"),
        )
        .orderBy("from_ns")
        .collect()
    )
    return [{k: v for k, v in r.asDict().items() if v is not None} for r in changes]


def moves(events: DataFrame, breaks: DataFrame) -> dict[str, Any]:
    """Messages moved to their group's new binding, and the order changes that accepted."""
    from pyspark.sql import functions as F

    moved = events.filter(F.col("kind") == "moved")
    row = moved.agg(
        F.count(F.lit(1)).alias("messages"),
        F.countDistinct("queue", "group").alias("groups"),
        F.sum(F.when(F.col("delivery_count") > 0, 1).otherwise(0)).alias("delivered_before"),
    ).first()
    accepted = breaks.filter(F.col("accepted")).count()
    return {
        "messages": int(row["messages"]),
        "groups": int(row["groups"]),
        "delivered_before": int(row["delivered_before"] or 0),
        "order_changes_accepted": int(accepted),
    }
