"""The checks: each takes the events (see history.py) and returns a DataFrame of violations.

Everything is Spark DataFrame work (window functions, joins, aggregations); only counts and a
few examples per kind ever reach Python. Events are ordered by `(ts_ns, n)`: the wall clock,
then the writer's sequence number for events written in the same instant.

Consumption is read from the nodes' events (`delivered`, `acked`, `released`, `rejected`)
when the history has any; a history with only client events is read from `client_received`
and `client_acked` instead. Internal queues (`$...`) never count as consumption.

Definitions (the counts are of the rows returned):
- lost: a `client_sent` message (the node confirmed it) that no consumer ever acked or
  rejected (no node `acked`/`rejected` on a consumer-visible queue, no `client_acked`).
- duplicates: a delivery of a message to a queue after an earlier one, where the event
  before it (for that message in that queue) was not a `released` or `rejected`, nor written
  by another node run that had ended before this delivery (a crash loses consumers).
- order violations: a message whose processing (its first ack or reject) came before that of
  the message just before it in its group (same queue, group and producer, by `group_seq`,
  messages with a positive sequence only). A predecessor never settled is reported as lost,
  not again here. A pair with a `moved` message (a node sent it on to its group's new
  binding: `rebind-absent-after`, or an operator's forced move) is an order change accepted
  by configuration, counted apart, not a violation.
- exclusivity violations: a consumer starting to hold unacknowledged messages of a group
  (a delivery while it held none of that group) while another consumer held some. A hold
  ends with the message's next event (acked, released, rejected) or with its node's run.
- routing: a group's binding whose `routed` events name more than one queue@node. A binding
  is the group's routes to one queue in one arbiter epoch, split at the LOCAL node's
  `unbound` events for it (after a removal the group may be bound again, elsewhere).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

SETTLE = ("acked", "rejected")
CONSUMPTION = ("delivered", "acked", "released", "rejected")
CLIENT_AS_NODE = {"client_received": "delivered", "client_acked": "acked"}


def _f():  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    return F


def _w():  # type: ignore[no-untyped-def]
    from pyspark.sql import Window

    return Window


def at(df: DataFrame) -> Column:
    """The event's position in time, comparable across events: (ts_ns, n)."""
    F = _f()
    return F.struct(F.col("ts_ns").alias("ts"), F.coalesce("n", F.lit(0)).alias("n"))


def consumption(events: DataFrame, node_deliveries: bool) -> DataFrame:
    """The consumption events checks work on: node events, or client ones if no node's.

    `node_deliveries`: the history has node `delivered` events on consumer-visible queues.
    """
    F = _f()
    visible = ~F.col("internal")
    if node_deliveries:
        return events.filter(F.col("kind").isin(*CONSUMPTION) & visible)
    mapping = F.create_map(*[F.lit(x) for pair in CLIENT_AS_NODE.items() for x in pair])
    client = events.filter(F.col("kind").isin(*CLIENT_AS_NODE) & visible)
    return client.withColumn("kind", mapping[F.col("kind")])


def per_message(cons: DataFrame, run_ends: DataFrame) -> DataFrame:
    """Deliveries with what came before and after them for the same message in its queue.

    One window pass (one sort) feeds the duplicate, order and exclusivity checks: `prev_*` and
    `next_*` are the events either side, `settled` the message's first ack or reject in that
    queue (as `at`), and `first` marks its first delivery.
    """
    F, W = _f(), _w()
    w = W.partitionBy("queue", "key").orderBy("ts_ns", "n")
    whole = w.rowsBetween(W.unboundedPreceding, W.unboundedFollowing)
    settled = F.min(F.when(F.col("kind").isin(*SETTLE), at(cons))).over(whole)
    delivered = F.when(F.col("kind") == "delivered", 1).otherwise(0)
    # One lag or lead per column, not of a struct: Spark builds a window function's input
    # before the shuffle, and a struct would ship those columns twice.
    with_ctx = cons.select(
        "ts_ns", "n", "kind", "node", "boot", "key", "queue", "group", "group_seq",
        "producer", "consumer",
        *[F.lag(c).over(w).alias(f"prev_{c}") for c in ("kind", "node", "boot", "ts_ns")],
        *[F.lead(c).over(w).alias(f"next_{c}") for c in ("kind", "ts_ns", "n")],
        settled.alias("settled"),
        (F.sum(delivered).over(w.rowsBetween(W.unboundedPreceding, 0)) == 1).alias("first"),
    )  # fmt: skip
    deliveries = with_ctx.filter(F.col("kind") == "delivered")
    run_ends = run_ends.groupBy("node", "boot").agg(F.max("run_end").alias("run_end"))
    prev_runs = run_ends.select(
        F.col("node").alias("p_node"),
        F.col("boot").alias("p_boot"),
        F.col("run_end").alias("p_end"),
    )
    own_runs = run_ends.select(
        F.col("node").alias("o_node"),
        F.col("boot").alias("o_boot"),
        F.col("run_end").alias("o_end"),
    )
    return (
        deliveries.join(
            F.broadcast(prev_runs),
            (F.col("prev_node") == F.col("p_node")) & (F.col("prev_boot") == F.col("p_boot")),
            "left",
        )
        .join(
            F.broadcast(own_runs),
            (F.col("node") == F.col("o_node")) & (F.col("boot") == F.col("o_boot")),
            "left",
        )
        .drop("p_node", "p_boot", "o_node", "o_boot")
    )


def lost(events: DataFrame) -> DataFrame:
    """The keys of confirmed messages never settled: one aggregation by key, no join or sort."""
    F = _f()
    sent = F.col("kind") == "client_sent"
    settles = (F.col("kind").isin(*SETTLE) & ~F.col("internal")) | (F.col("kind") == "client_acked")
    return (
        events.filter(sent | settles)
        .groupBy("key")
        .agg(F.max(sent).alias("sent"), F.max(settles).alias("settled"))
        .filter(F.col("sent") & ~F.col("settled"))
        .select("key")
    )


def lost_details(events: DataFrame, keys: DataFrame) -> DataFrame:
    """The lost messages `keys` (a few) with the fields of their first `client_sent`."""
    F = _f()
    what = ("producer", "address", "group", "group_seq", "msg_id", "node", "ts_ns")
    sent = events.filter(F.col("kind") == "client_sent").join(F.broadcast(keys), "key")
    return (
        sent.groupBy("key")
        .agg(F.min_by(F.struct(*what), F.struct("ts_ns", "n")).alias("sent"))
        .select("key", *[F.col(f"sent.{c}").alias(c) for c in what])
    )


def duplicates(deliveries: DataFrame) -> DataFrame:
    F = _f()
    legit = F.col("prev_kind").isin("released", "rejected") | (
        ((F.col("prev_node") != F.col("node")) | (F.col("prev_boot") != F.col("boot")))
        & (F.col("p_end") < F.col("ts_ns"))
    )
    return deliveries.filter(F.col("prev_kind").isNotNull() & ~legit).select(
        "key", "queue", "group", "group_seq", "consumer", "node", "ts_ns",
        F.col("prev_kind").alias("previous_event"), F.col("prev_ts_ns").alias("previous_ts_ns"),
    )  # fmt: skip


def order(deliveries: DataFrame, moved: DataFrame | None = None) -> DataFrame:
    """Order breaks; with `moved` (keys of `moved` events), a break with a moved message on
    either side is marked `accepted`: a move changed that order, as configured."""
    F, W = _f(), _w()
    messages = deliveries.filter(
        F.col("first") & F.col("group").isNotNull() & (F.col("group_seq") > 0)
    ).select("queue", "group", "producer", "key", "group_seq", "settled")
    w = W.partitionBy("queue", "group", "producer").orderBy("group_seq")
    ranked = messages.select(
        "*",
        F.lag("key").over(w).alias("before_key"),
        F.lag("group_seq").over(w).alias("before_seq"),
        F.lag("settled").over(w).alias("before_settled"),
    )
    breaks = ranked.filter(
        F.col("settled").isNotNull()
        & F.col("before_settled").isNotNull()
        & (F.col("settled") < F.col("before_settled"))
    ).select(
        "queue", "group", "producer", "key", "group_seq", "before_key", "before_seq",
        F.col("settled.ts").alias("settled_ts_ns"),
        F.col("before_settled.ts").alias("before_settled_ts_ns"),
    )  # fmt: skip
    if moved is None:
        return breaks.withColumn("accepted", F.lit(False))
    mine = moved.select("key", F.lit(True).alias("moved_self"))
    theirs = moved.select(F.col("key").alias("before_key"), F.lit(True).alias("moved_before"))
    return (
        breaks.join(F.broadcast(mine), "key", "left")
        .join(F.broadcast(theirs), "before_key", "left")
        .withColumn("accepted", F.coalesce("moved_self", "moved_before", F.lit(False)))
        .drop("moved_self", "moved_before")
    )


def moved_keys(events: DataFrame) -> DataFrame:
    """The messages some node moved to their group's new binding (`moved` events)."""
    F = _f()
    return events.filter(F.col("kind") == "moved").select("key").distinct()


def exclusivity(deliveries: DataFrame) -> DataFrame:
    F, W = _f(), _w()
    grouped = deliveries.filter(F.col("group").isNotNull() & F.col("consumer").isNotNull())
    ends = F.col("next_kind").isin("acked", "released", "rejected")
    start = grouped.select(
        "queue", "group", "consumer", "key", "node", "ts_ns", "n", F.lit(1).alias("delta")
    )
    end = grouped.select(
        "queue", "group", "consumer", "key", "node",
        F.when(ends, F.col("next_ts_ns")).otherwise(F.col("o_end")).alias("ts_ns"),
        F.when(ends, F.col("next_n")).otherwise(F.lit(1 << 62)).alias("n"),
        F.lit(-1).alias("delta"),
    ).filter(F.col("ts_ns").isNotNull())  # fmt: skip
    holds = start.unionByName(end)
    rows = W.unboundedPreceding, -1
    by_group = W.partitionBy("queue", "group").orderBy("ts_ns", "n", "delta")
    by_consumer = W.partitionBy("queue", "group", "consumer").orderBy("ts_ns", "n", "delta")
    # The group's window first: its partitioning (queue, group) serves the consumer's too, so
    # the holds are shuffled once and sorted twice.
    counted = holds.withColumn(
        "all", F.coalesce(F.sum("delta").over(by_group.rowsBetween(*rows)), F.lit(0))
    ).withColumn("mine", F.coalesce(F.sum("delta").over(by_consumer.rowsBetween(*rows)), F.lit(0)))
    return counted.filter(
        (F.col("delta") == 1) & (F.col("mine") == 0) & (F.col("all") > 0)
    ).select(
        "queue", "group", "consumer", "key", "node", "ts_ns",
        F.col("all").alias("held_by_others"),
    )  # fmt: skip


def routed_events(events: DataFrame) -> DataFrame:
    F = _f()
    return events.filter(F.col("kind") == "routed").select(
        "ts_ns", "n", "epoch", "address", "queue", "group", "target", "new_proposal",
        "decision_ns",
    )  # fmt: skip


def routing(routed: DataFrame, events: DataFrame, unbound: bool) -> DataFrame:
    """A group's binding (its routes in one epoch between two of its removals) naming two
    targets. Keyed like bindings, by (group, queue): multicast copies go to several queues.
    `unbound` events (the LOCAL node's removals) end one binding of a group and start the next;
    without any (`unbound` false) a binding is a (group, queue, epoch), and no sort is needed.
    """
    F, W = _f(), _w()
    routes = routed.filter(F.col("group").isNotNull()).select(
        "ts_ns", "n", "epoch", "queue", "group", "address", "target",
        F.lit(0).alias("removal"),
    )  # fmt: skip
    if unbound:
        removals = events.filter(F.col("kind") == "unbound").select(
            "ts_ns", "n", "epoch", "queue", "group", F.lit(1).alias("removal")
        )
        by_time = W.partitionBy("queue", "group", "epoch").orderBy("ts_ns", "n", "removal")
        binding = F.sum("removal").over(by_time.rowsBetween(W.unboundedPreceding, 0))
        routes = (
            routes.unionByName(removals, allowMissingColumns=True)
            .withColumn("binding", binding)
            .filter(F.col("removal") == 0)
        )
    else:
        routes = routes.withColumn("binding", F.lit(0))
    # Counted per target first: a hash aggregation, where a set of targets per binding is an
    # object aggregation that sorts once a task holds more than a few bindings.
    binding = ("queue", "group", "epoch", "binding")
    per_target = routes.groupBy(*binding, "address", "target").agg(F.count(F.lit(1)).alias("n"))
    return (
        per_target.groupBy(*binding)
        .agg(
            F.first("address").alias("address"),
            F.array_sort(F.collect_set("target")).alias("targets"),
            F.sum("n").alias("events"),
        )
        .filter(F.size("targets") > 1)
        .drop("binding")
    )
