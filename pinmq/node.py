"""The node process: the one place that composes every part of a node.

It builds the engine (core + store, `broker/engine.py`), the send path (standalone or
clustered), the cluster connections and the grouping handler when configured, and the
protocol shells (gRPC, STOMP, HTTP with its console) that reach them only through those
seams. It owns the lifecycle: start in dependency order, stop in reverse, exit code for the
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import Any

from grpc import aio
from grpc_health.v1 import health, health_pb2
from prometheus_client.registry import CollectorRegistry

from broker import logs
from broker.audit_schema import Kind
from broker.authenticator import Authenticator
from broker.config import NodeConfig
from broker.core import CoreError
from broker.engine import Engine, StartupError
from broker.kept_index import KeptIndex
from broker.readiness import Readiness, assess
from broker.refusals import Refusals
from broker.sending import LocalSendPath, SendPath
from broker.users import UsersFileError
from cluster.admin import ClusterAdministration
from cluster.claims import GroupClaims
from cluster.ha import PairShell, grace_s
from cluster.member import ClusterMember
from cluster.replication import Replicator, Source
from cluster.sending import ClusteredSendPath
from cluster.topology import Topology
from handler.api import Binding, GroupingHandler, RemovalReason
from handler.bindings import BindingStoreError
from handler.factory import make_handler
from pinmq.console import Console, ConsoleSources
from pinmq.grpc_api import make_server, mark_serving
from pinmq.grpc_connections import open_connections
from pinmq.http import HttpServer
from pinmq.metrics import NodeCollector
from pinmq.stomp.server import StompServer

REDISTRIBUTE_S = 0.5  # queues without consumers hand ungrouped messages on this often
CLUSTER_HEALTH = "pinmq.cluster"  # health service: NOT_SERVING while the cluster has problems
log = logs.get("node")


class _ClusterObserver:
    """Tells the cluster (and the grouping handler) what changed in the engine."""

    def __init__(
        self,
        engine: Engine,
        cluster: ClusterMember,
        sending: ClusteredSendPath,
        handler: GroupingHandler | None,
    ) -> None:
        self.engine = engine
        self.cluster = cluster
        self.sending = sending
        self.handler = handler

    def queues_changed(self) -> None:
        self.cluster.local_changed()

    def consumers_changed(self, queue: str) -> None:
        """A consumer subscribed or left: announce it; maybe redistribute ungrouped messages."""
        self.cluster.local_changed()
        with contextlib.suppress(CoreError):  # the queue was deleted meanwhile
            self.sending.redistribute(self.engine.queue(queue))

    def queue_deleted(self, queue: str) -> None:
        """Bindings to a deleted queue are removed cluster-wide: its groups are proposed again."""
        if self.handler is not None:
            self.handler.instance_deleted(queue, self.cluster.node_id)


class Node:
    """One broker node: engine + send path + cluster + grouping handler + servers."""

    def __init__(self, config: NodeConfig, pair: PairShell | None = None) -> None:
        self.config = config
        self.pair = pair  # ha: the failover shell of the pair process this node serves for
        # A pair process that lost its quorum carries out and records nothing.
        self.engine = Engine(config, pair.may_serve if pair is not None else None)
        self.sending: SendPath = LocalSendPath()
        self.clustered: ClusteredSendPath | None = None  # the send path, when clustered
        self.cluster: ClusterMember | None = None  # set by start() when `cluster` is configured
        self.handler: GroupingHandler | None = None  # set with the cluster, if configured
        self.claims: GroupClaims | None = None  # with a grouping handler
        self.problems: list[str] = []  # cluster misconfigurations, as last seen
        self._problems_logged: list[str] = []
        self._cluster_started = 0.0  # problems are logged after a grace period from then on
        self._grace: asyncio.TimerHandle | None = None
        self._server: aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None
        self._stomp: StompServer | None = None
        self._http: HttpServer | None = None
        self.authenticator: Authenticator | None = None  # with security: users, permissions
        self.refusals = Refusals()  # what the protocol shells refused, by reason (metrics)
        self._serving = False
        self._tasks: list[asyncio.Task[None]] = []
        self._health_update: asyncio.Future[None] | None = None

    @property
    def failed(self) -> asyncio.Future[BaseException]:
        return self.engine.failed

    # ---- lifecycle ------------------------------------------------------------------------

    async def start(self, kept: KeptIndex | None = None) -> None:
        """Open and replay the store (`kept`: its index, as an ha backup kept it), then serve;
        raises StartupError naming the culprit."""
        engine = self.engine
        try:
            self.authenticator = Authenticator.of(self.config.security, engine.audit)
        except UsersFileError as err:
            raise StartupError(str(err)) from None
        messages, orphans = engine.open(kept)
        try:
            if self.config.cluster is not None:
                self._build_cluster()
            admin = ClusterAdministration(self.cluster, self.handler) if self.cluster else None
            gate = self.authenticator
            self._stomp = StompServer(engine, self.sending, gate, self.refusals)
            await self._stomp.start(accept=False)
            metrics = self._metrics()  # one registry: GET /metrics and Admin.Metrics
            self._server, self._health = make_server(
                engine,
                self.sending,
                admin,
                gate,
                refusals=self.refusals,
                metrics=metrics,
                readiness=self.readiness,
            )
            console = Console(ConsoleSources(self.config.node.id, self.readiness, engine, admin))
            self._http = HttpServer.of(self.config, self.readiness, gate, metrics, console.routes())
            await self._http.start()
        except OSError as err:
            if self._stomp is not None:
                await self._stomp.stop(0)
            if self._server is not None:
                await self._server.stop(None)
            await engine.close()
            raise StartupError(str(err)) from None
        # Clients come in only once the node can route what they send (its grouping handler
        # runs): an ha backup taking over must not answer its first clients "not running".
        if self.cluster is not None:
            await self._start_cluster()
        await self._server.start()
        await self._stomp.accept()
        await mark_serving(self._health)
        self._serving = True
        if self.clustered is not None:
            await self._set_cluster_health()
            redistributing = self._redistribute_loop(self.clustered)
            self._tasks.append(asyncio.create_task(redistributing, name="redistribute"))
        engine.start()
        log.info(
            "node started",
            listen=self.config.listen.client,
            stomp=self.config.listen.stomp,
            http=self.config.listen.http,
            store=str(engine.store_path),
            queues=len(engine.queues()),
            messages=messages,
            orphans=orphans,
            restored_from=engine.restored_from,
        )

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, end consumer streams, let running calls finish, close the store."""
        log.info("node stopping")
        self._serving = False
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self.claims is not None:
            await _bounded("group claims", self.claims.stop())
        if self.handler is not None:  # first: it ends its Removals streams on the cluster server
            await _bounded("grouping handler", self.handler.stop())
        if self.cluster is not None:
            await _bounded("cluster", self.cluster.stop())
        self.engine.end_streams("the node is shutting down")
        if self._stomp is not None:
            await self._stomp.stop(grace_s)
        if self._server is not None:
            await self._server.stop(grace_s)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.engine.close()
        if self._http is not None:  # last: probes see "not ready" until the very end
            await self._http.stop()
        if self.authenticator is not None:
            self.authenticator.close()
        self.engine.close_audit()
        log.info("node stopped")

    def _build_cluster(self) -> None:
        """Cluster connections (cluster/), the grouping handler (handler/), the send path."""
        engine = self.engine
        self.cluster = cluster = ClusterMember(engine, self.pair)
        epoch = self.pair.epoch if self.pair is not None else 1  # fixed while it serves
        self.handler = make_handler(
            self.config, cluster.locate_local_handler, cluster.add_servicer, epoch
        )
        self.sending = self.clustered = ClusteredSendPath(engine, cluster, self.handler)
        grouping = self.config.grouping_handler
        if self.handler is not None and grouping is not None:
            self.claims = GroupClaims(engine, cluster, self.handler, grouping)
            self.claims.hold_restored()  # before any consumer can subscribe
        engine.observers.append(_ClusterObserver(engine, cluster, self.clustered, self.handler))

    async def _start_cluster(self) -> None:
        """The handler starts first, so its gRPC service answers as soon as listen.cluster does."""
        cluster, handler = self.cluster, self.handler
        assert cluster is not None
        if handler is not None:
            try:
                await handler.start()
            except BindingStoreError as err:
                await self.stop(0)
                raise StartupError(str(err)) from None
            handler.on_removed(self._binding_removed)
            if self.claims is not None:
                handler.on_removed(self.claims.removed)
                handler.on_lease_lapsed(self.claims.lapsed)
                self.claims.start()
            if self.config.grouping_handler.type == "LOCAL":  # type: ignore[union-attr]
                cluster.on_instances_changed(self._report_instances)
                if self.engine.audit is not None:
                    handler.on_removed(self._audit_removal)
        cluster.on_instances_changed(self._topology_changed)
        self._cluster_started = time.monotonic()
        try:
            await cluster.start(self.claims, self._replicator(handler))
        except OSError as err:
            await self.stop(0)
            raise StartupError(str(err)) from None

    def _replicator(self, handler: GroupingHandler | None) -> Replicator | None:
        """ha, the active process: every write of the store (and of the bindings, LOCAL) goes
        to the backup too, and only while this process holds the node (`PairShell` is the
        gate)."""
        ha, pair = self.config.ha, self.pair
        if ha is None or pair is None:
            return None
        store = self.engine.store
        sources: dict[str, Source] = {"store": store}
        bindings = handler.bindings_store if handler is not None else None
        if bindings is not None:
            sources["bindings"] = bindings
        return Replicator(self.config.node.id, sources, ha.failure_timeout, pair, store.commit_ns)

    async def _redistribute_loop(self, clustered: ClusteredSendPath) -> None:
        while True:
            await asyncio.sleep(REDISTRIBUTE_S)
            clustered.redistribute_all()

    def _report_instances(self, topology: Topology) -> None:
        """Tell the LOCAL handler which instances exist; those of down nodes count as absent."""
        assert self.handler is not None
        self.handler.report_instances(
            {
                (queue, view.state.node_id): view.connected
                for view in topology.nodes()
                for queues in view.state.instances.values()
                for queue in queues
            }
        )

    def _binding_removed(self, binding: Binding, reason: RemovalReason) -> None:
        """A binding went away cluster-wide: the local queue unpins the group from its consumer."""
        try:
            with self.engine.unit() as unit:
                unit.reset_groups(binding.queue, binding.group)
        except CoreError:
            return  # no such queue or group here

    def _audit_removal(self, binding: Binding, reason: RemovalReason) -> None:
        """The LOCAL node's record of a removed binding: the checker then accepts a new one."""
        assert self.engine.audit is not None
        self.engine.audit.record(
            Kind.UNBOUND,
            epoch=binding.epoch,
            group=binding.group,
            queue=binding.queue,
            target=f"{binding.queue}@{binding.node}",
            reason=str(reason),
        )

    def _topology_changed(self, topology: Topology) -> None:
        problems = topology.problems()
        if problems != self.problems:
            self.problems = problems
            self._log_problems()
            if self._health is not None:
                self._health_update = asyncio.ensure_future(self._set_cluster_health())
        if self.clustered is not None:
            self.clustered.redistribute_all()

    def _log_problems(self) -> None:
        """Log cluster problems loudly when they change, once the start-up grace period is
        over: until then a REMOTE node normally sees no LOCAL grouping handler."""
        if self.problems == self._problems_logged:
            return
        wait = self._cluster_started + self._grace_s() - time.monotonic()
        if wait > 0:
            if self._grace is None:
                self._grace = asyncio.get_running_loop().call_later(wait, self._grace_over)
            return
        if self.problems:
            log.error("cluster misconfigured", problems=self.problems)
        elif self._problems_logged:
            log.info("cluster problems resolved")
        self._problems_logged = self.problems

    def _grace_over(self) -> None:
        self._grace = None
        if self._serving:
            self._log_problems()

    def _grace_s(self) -> float:
        """Four reconnect-intervals (at least 2 s) for the links to come up. A REMOTE node's
        LOCAL node may be an ha pair, which elects first: as long as that may take
        (`cluster.ha.grace_s`, at the pair timing its votes heard of, else the default)."""
        assert self.cluster is not None
        reconnect = self.cluster.config.reconnect_interval
        links = max(2.0, 4 * reconnect / 1000)
        handler = self.config.grouping_handler
        if handler is None or handler.type != "REMOTE":
            return links
        return max(links, grace_s(self.cluster.voters.timing(), reconnect))

    async def _set_cluster_health(self) -> None:
        assert self._health is not None
        status = health_pb2.HealthCheckResponse
        await self._health.set(
            CLUSTER_HEALTH, status.NOT_SERVING if self.problems else status.SERVING
        )

    def readiness(self) -> Readiness:
        """Whether this node takes work now, with the facts (for `GET /readyz`)."""
        cluster, handler = self.cluster, self.config.grouping_handler
        peers: dict[str, bool] = {}
        local_handler = None
        if cluster is not None:
            topology = cluster.topology
            peers = {n: topology.is_connected(n) for n in topology.peers()}
            found = topology.local_handler()
            local_handler = found[0] if found is not None else None
        failed = self.engine.failed
        return assess(
            node_id=self.config.node.id,
            serving=self._serving,
            store_open=self.engine.store_open,
            failed=str(failed.result()) if failed.done() else None,
            clustered=self.config.cluster is not None,
            handler_type=handler.type if handler is not None and cluster is not None else None,
            local_handler=local_handler,
            peers=peers,
            problems=self.problems,
            resources=self.engine.resources(),
            ha=self._ha_status(),
        )

    def _metrics(self) -> CollectorRegistry:
        """What `GET /metrics` and `pinmq top` read, at scrape time (`pinmq/metrics.py`)."""
        collector = NodeCollector(
            self.config.node.id,
            self.engine,
            self._connections,
            self.cluster,
            self._ha_status,
            self.config.metrics.top_groups,
            self.handler,
            self.refusals,
        )
        return collector.registry()

    def _connections(self) -> dict[str, int]:
        """Open client connections per protocol (gRPC's as its channelz registry counts them)."""
        stomp = self._stomp
        counts = {"stomp": len(stomp.connections) if stomp is not None else 0}
        grpc_open = open_connections(int(self.config.listen.client.rsplit(":", 1)[1]))
        if grpc_open is not None:
            counts["grpc"] = grpc_open
        return counts

    def _ha_status(self) -> dict[str, Any] | None:
        cluster, pair = self.cluster, self.pair
        if pair is None:
            return None
        replicator = cluster.replicator if cluster is not None else None
        return {**pair.describe(), **(replicator.status() if replicator is not None else {})}


STEP_LIMIT_S = 5.0  # a stop step that takes longer is abandoned (and logged)


async def _bounded(step: str, stopping: Coroutine[Any, Any, None]) -> None:
    """Run one step of a clean stop for at most STEP_LIMIT_S: a step that hangs (a peer's
    channel that does not close) must not keep the node from exiting and closing its store."""
    task = asyncio.ensure_future(stopping)
    done, _ = await asyncio.wait({task}, timeout=STEP_LIMIT_S)
    if not done:
        task.cancel()
        log.warning("stop step did not finish in time: going on without it", step=step)
    elif task.exception() is not None:
        log.error("stop step failed", step=step, error=repr(task.exception()))
