"""`GET /metrics`: a node's state in the Prometheus text format, read when Prometheus scrapes.

A custom collector reads what the node keeps anyway (the engine's queue views and resources,
the cluster member's topology and store-and-forward queues, the ha shell's state); a message
does no work for metrics beyond a few counts the queue keeps (broker/queue_stats.py). A scrape
costs one pass over the queues, their consumers and peers, and never walks a queue's groups
(pinmq/queue_metrics.py): a queue of a million groups scrapes as fast as one of ten.
Every family carries the `node` label (the node id this process answers as); docs/operations.md
lists them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from broker.audit import AuditLog
from broker.clock import now_ns
from broker.engine import Engine, QueueView
from broker.histogram import Histogram
from broker.info import QueueCounts
from broker.queue_stats import NS_PER_S
from broker.refusals import Refusals
from broker.store_base import StoreBase
from cluster.bridge import sf_queue
from cluster.failover_states import Role
from cluster.member import ClusterMember
from handler.api import GroupingHandler
from handler.local import LocalHandler
from handler.remote import RemoteHandler
from pinmq.queue_metrics import age_s, queue_metrics

Rows = Iterable[tuple[Sequence[str], float]]


def _gauge(name: str, doc: str, labels: Sequence[str], rows: Rows) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for values, value in rows:
        family.add_metric(list(values), value)
    return family


def _one(name: str, doc: str, node: str, value: float) -> GaugeMetricFamily:
    """A gauge of the node as a whole."""
    return _gauge(name, doc, ("node",), [((node,), value)])


def _count(name: str, doc: str, node: str, value: float) -> CounterMetricFamily:
    """A counter of the node as a whole (`name` without `_total`: the family adds it)."""
    family = CounterMetricFamily(name, doc, labels=["node"])
    family.add_metric([node], value)
    return family


@dataclass(frozen=True, eq=False)  # eq=False: hashed by identity, as the registry keys it
class NodeCollector(Collector):
    """The node's metrics, read at scrape time; a passive ha process has only `ha`.

    `connections`: open client connections per protocol; `ha`: the pair member's state as
    `/readyz` reports it (`PairShell.describe` and its replication's status); `top_groups`:
    metrics.top-groups.
    """

    node_id: str
    engine: Engine | None = None
    connections: Callable[[], Mapping[str, int]] | None = None
    cluster: ClusterMember | None = None
    ha: Callable[[], Mapping[str, Any] | None] | None = None
    top_groups: int = 20  # metrics.top-groups
    handler: GroupingHandler | None = None
    refusals: Refusals | None = None
    clock: Callable[[], int] = now_ns  # the wall clock messages are stamped with

    def registry(self) -> CollectorRegistry:
        """A registry of this collector alone (no process metrics of the client library)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return registry

    def collect(self) -> Iterator[Metric]:
        engine = self.engine
        if engine is not None:
            queues, now = engine.queues(), self.clock()
            counts = {q.name: q.counts() for q in queues}  # one read per queue and scrape
            yield from queue_metrics(self.node_id, queues, counts, self.top_groups, now)
            yield from _resources(self.node_id, engine.resources())
            if engine.store_open:
                yield from _store(self.node_id, engine.store)
            if engine.audit is not None:
                yield from _audit(self.node_id, engine.audit)
            if self.cluster is not None:
                yield from _cluster(self.node_id, self.cluster, queues, counts, now)
        if self.connections is not None:
            counts = self.connections()
            yield _gauge(
                "pinmq_connections",
                "Open client connections, per protocol.",
                ("node", "protocol"),
                (((self.node_id, p), n) for p, n in sorted(counts.items())),
            )
        if self.refusals is not None:
            refused = CounterMetricFamily(
                "pinmq_refused_requests",
                "Requests the node refused, by protocol and reason (the gRPC status code name; "
                "a STOMP ERROR frame counts under its cause's).",
                labels=["node", "protocol", "reason"],
            )
            for (protocol, reason), n in sorted(self.refusals.counts.items()):
                refused.add_metric([self.node_id, protocol, reason], n)
            yield refused
        if self.handler is not None:
            yield from _handler(self.node_id, self.handler)
        ha = self.ha() if self.ha is not None else None
        if ha is not None:
            yield from _ha(self.node_id, ha)


def _resources(node: str, r: Mapping[str, Any]) -> Iterator[Metric]:
    """Memory, disk and producers, from `Engine.resources` (what `/readyz` reports)."""
    gauges = (
        ("pinmq_memory_used_bytes", "Bytes of messages held in memory.", r["memory_bytes"]),
        ("pinmq_memory_limit_bytes", "limits.global-max-size.", r["global_max_size"]),
        ("pinmq_disk_usage_ratio", "Data volume in use (0-1).", r["disk_percent"] / 100),
        (
            "pinmq_disk_usage_limit_ratio",
            "limits.max-disk-usage (0-1): persistent sends refused at or above it.",
            r["max_disk_usage"] / 100,
        ),
        ("pinmq_blocked_producers", "Sends waiting for room.", r["blocked_producers"]),
    )
    for name, doc, value in gauges:
        yield _one(name, doc, node, value)
    yield _count(
        "pinmq_duplicates_dropped",
        "Messages dropped as duplicates (_AMQ_DUPL_ID) since the node started.",
        node,
        r["duplicates_dropped"],
    )


def _histogram(name: str, doc: str, node: str, h: Histogram, scale: float) -> Metric:
    """`h` in its base unit (its values divided by `scale`)."""
    family = HistogramMetricFamily(name, doc, labels=["node"])
    family.add_metric([node], h.cumulative(scale), h.sum / scale)
    return family


def _store(node: str, store: StoreBase) -> Iterator[Metric]:
    """The store's transactions (counted by its writer thread)."""
    yield _histogram(
        "pinmq_store_commit_seconds",
        "A store transaction from BEGIN to COMMIT, its fsync included.",
        node,
        store.commit_ns,
        NS_PER_S,
    )
    yield _histogram(
        "pinmq_store_commit_operations",
        "The writes one store transaction carried (sends, acks, updates folded in a batch).",
        node,
        store.batch_ops,
        1,
    )


def _audit(node: str, audit: AuditLog) -> Iterator[Metric]:
    """The audit log's writer: what it wrote, lost to failed writes, and has yet to write."""
    for name, doc, value in (
        ("pinmq_audit_written_events", "Audit events written.", audit.written),
        (
            "pinmq_audit_dropped_events",
            "Audit events lost to failed writes (a full disk): `pinmq check` misses them.",
            audit.dropped,
        ),
    ):
        yield _count(name, doc, node, value)
    yield _one(
        "pinmq_audit_backlog_entries",
        "Entries (an event or a batch of them) waiting for the audit writer thread.",
        node,
        audit.backlog,
    )


def _handler(node: str, handler: GroupingHandler) -> Iterator[Metric]:
    """The grouping handler: decisions asked, their time, timeouts, bindings, removals."""
    stats = handler.stats
    counters = (
        (
            "pinmq_grouping_proposals",
            "Binding decisions asked for (LOCAL: received, its own node's included; REMOTE: "
            "sent to the LOCAL handler).",
            stats.proposals,
        ),
        ("pinmq_grouping_bindings_created", "Proposals that made a new binding.", stats.created),
        (
            "pinmq_grouping_timeouts",
            "Decisions that did not come within the grouping handler's timeout: sends failed.",
            stats.timeouts,
        ),
    )
    for name, doc, value in counters:
        yield _count(name, doc, node, value)
    yield _histogram(
        "pinmq_grouping_decision_seconds",
        "From asking for a binding to the answer (LOCAL: durable in the bindings file).",
        node,
        stats.decisions,
        NS_PER_S,
    )
    removals = CounterMetricFamily(
        "pinmq_grouping_bindings_removed",
        "Bindings removed, by reason: reaped, unbound, instance-deleted, instance-absent (LOCAL).",
        labels=["node", "reason"],
    )
    for reason, count in sorted(stats.removals.items()):
        removals.add_metric([node, reason], count)
    yield removals
    if isinstance(handler, LocalHandler):
        yield _one(
            "pinmq_grouping_bindings",
            "Bindings the LOCAL handler holds.",
            node,
            len(handler.arbiter),
        )
        yield _one(
            "pinmq_grouping_arbiter_epoch",
            "The LOCAL handler's arbiter epoch.",
            node,
            handler.arbiter.epoch,
        )
    elif isinstance(handler, RemoteHandler):
        lease = handler.lease
        yield _one(
            "pinmq_grouping_lease_held",
            "REMOTE: 1 while the node may deliver grouped messages (its lease from the LOCAL "
            "handler holds, or leases are off), else 0.",
            node,
            int(lease.holds()),
        )
        yield _count(
            "pinmq_grouping_lease_lapses",
            "REMOTE: times the node's lease ran out unrenewed and it held its groups.",
            node,
            lease.lapses,
        )


def _cluster(
    node: str,
    cluster: ClusterMember,
    queues: Sequence[QueueView],
    counts: Mapping[str, QueueCounts],
    now_ns: int,
) -> Iterator[Metric]:
    """Links, store-and-forward queues (one per peer with messages on their way) and the
    grouping handler's type."""
    topology = cluster.topology
    yield _gauge(
        "pinmq_peer_linked",
        "1 while the peer is linked by gossip, else 0.",
        ("node", "peer"),
        (((node, peer), int(topology.is_connected(peer))) for peer in topology.peers()),
    )
    prefix = sf_queue(cluster.config.name, "")
    forwarding = [((node, q.name[len(prefix) :]), q) for q in queues if q.name.startswith(prefix)]
    yield _gauge(
        "pinmq_store_and_forward_messages",
        "Messages on their way to the peer: waiting, or sent and not yet confirmed.",
        ("node", "peer"),
        ((labels, q.depth) for labels, q in forwarding),
    )
    yield _gauge(
        "pinmq_store_and_forward_oldest_age_seconds",
        "How long the oldest message on its way to the peer (in memory) has waited (0: none).",
        ("node", "peer"),
        ((labels, age_s(counts[q.name].oldest_ns, now_ns)) for labels, q in forwarding),
    )
    bridges = sorted(cluster.bridges().items())
    for name, doc, field in (
        ("pinmq_bridge_forwarded_messages", "Messages sent to the peer, resends counted.", "sent"),
        ("pinmq_bridge_confirmed_messages", "Forwarded messages the peer confirmed.", "acked"),
    ):
        counter = CounterMetricFamily(name, doc, labels=["node", "peer"])
        for peer, bridge in bridges:
            counter.add_metric([node, peer], getattr(bridge, field))
        yield counter
    receiver = cluster.receiver
    for name, doc, value in (
        (
            "pinmq_forward_duplicates",
            "Forwarded messages received again (after a peer's reconnect) and dropped as such.",
            receiver.duplicates,
        ),
        (
            "pinmq_forward_dropped",
            "Forwarded messages dropped on arrival: refused by their queue, or no queue and no "
            "dead-letter address.",
            receiver.dropped,
        ),
    ):
        yield _count(name, doc, node, value)
    if cluster.handler_type is not None:
        handler = InfoMetricFamily(
            "pinmq_grouping_handler", "The node's grouping handler.", labels=["node"]
        )
        handler.add_metric([node], {"type": cluster.handler_type})
        yield handler


def _ha(node: str, ha: Mapping[str, Any]) -> Iterator[Metric]:
    """The pair member: its role, the epoch, and whether the backup holds everything (on the
    active process: its backup; on the passive one: itself)."""
    role = ha["role"]
    yield _gauge(
        "pinmq_ha_role",
        "1 for the pair member's current failover role, 0 for the others.",
        ("node", "role"),
        (((node, r.value), int(r.value == role)) for r in Role),
    )
    yield _one("pinmq_ha_epoch", "The pair's epoch as this member knows it.", node, ha["epoch"])
    in_sync = ha["backup_in_sync"] if "backup_in_sync" in ha else ha["in_sync"]
    yield _one(
        "pinmq_ha_backup_in_sync",
        "1 while the pair's backup holds every write, else 0.",
        node,
        int(bool(in_sync)),
    )
    for name, doc, key in (
        (
            "pinmq_ha_backup_behind_records",
            "Replication records the backup has not confirmed yet (active process).",
            "backup_behind",
        ),
        (
            "pinmq_ha_backup_behind_bytes",
            "Bytes of replication records the backup has not confirmed yet (active process).",
            "backup_behind_bytes",
        ),
    ):
        if key in ha:
            yield _one(name, doc, node, ha[key])
    for name, doc, key in (
        (
            "pinmq_ha_elections_won",
            "Times this process became the pair's active process since it started.",
            "elected",
        ),
        (
            "pinmq_ha_takeovers",
            "Failovers: elections this process won against an active process that fell silent.",
            "takeovers",
        ),
    ):
        yield _count(name, doc, node, ha[key])
