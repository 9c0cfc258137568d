"""The node process: the asyncio shell that owns the core, the store and the gRPC and STOMP servers.

The node is the only writer of `BrokerCore`; every call happens on the event loop thread. Each
core call returns `Effects`, which `apply` carries out: the store write starts at once, and
deliveries reach consumer streams strictly in the order the core produced them, never before
the messages they carry are on disk (each waits for the write that adds its own message).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import deque
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpc import aio
from grpc_health.v1 import health
from pydantic import ValidationError

from broker import logs
from broker.audit import node_audit
from broker.config import NodeConfig, QueueConfig
from broker.core import BrokerCore, CoreError
from broker.message import Message
from broker.queue import Delivery, Effects
from broker.readiness import Readiness, assess
from broker.store import Store, StoreError
from pinmq.http import HttpServer

if TYPE_CHECKING:
    from cluster.node import ClusterNode
    from cluster.sending import Sender
    from cluster.topology import Topology
    from handler.api import Binding, GroupingHandler, RemovalReason
    from pinmq.stomp.server import StompServer

TICK_S = 0.05
REDISTRIBUTE_TICKS = 10  # queues without consumers hand ungrouped messages on this often
STORE_FILE = "store.db"
CLUSTER_HEALTH = "pinmq.cluster"  # health service: NOT_SERVING while the cluster has problems
log = logs.get("node")


class StartupError(Exception):
    """The node cannot start; the message names what (file, address) and why."""


@dataclass(slots=True)
class Receipt:
    """Settled delivery ids, to be confirmed to the consumer once their outcome is stored."""

    delivery_ids: list[int]


@dataclass(slots=True, eq=False)
class ConsumerStream:
    """One subscribed consumer as the shells see it: its outbound queue and its end.

    `outbound` holds lists of deliveries and receipts in the order they must be sent; the
    transport drains it. `ended` completes (with a status code name and a reason) when the
    node ends the subscription, e.g. because its queue was deleted.
    """

    consumer_id: str
    queue: str
    outbound: asyncio.Queue[list[Delivery] | Receipt] = field(default_factory=asyncio.Queue)
    ended: asyncio.Future[tuple[str, str]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def end(self, code: str, reason: str) -> None:
        if not self.ended.done():
            self.ended.set_result((code, reason))


@dataclass(slots=True)
class _Step:
    """Deliveries (and a receipt) waiting for store writes before they may go out."""

    gates: list[asyncio.Future[None]]
    deliveries: list[Delivery]
    receipt: tuple[ConsumerStream, Receipt] | None


def _settings(settings: QueueConfig) -> dict[str, object]:
    return settings.model_dump(mode="json", by_alias=True)


def now_ns() -> int:
    """Wall-clock time for the core: stored with messages, so it must survive a restart."""
    return time.time_ns()


class Node:
    """One broker node: core + store + client gRPC server + STOMP listener + timers."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.core = BrokerCore(config)
        self.streams: dict[str, ConsumerStream] = {}
        self.store_path = Path(config.node.data_dir) / STORE_FILE
        self._store: Store | None = None
        self._server: aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None
        self._stomp: StompServer | None = None
        self._http: HttpServer | None = None
        self._serving = False
        self._backlog: deque[_Step] = deque()
        self._backlog_ready = asyncio.Event()
        self._unwritten: dict[int, asyncio.Future[None]] = {}  # msg id -> write that adds it
        self._tasks: list[asyncio.Task[None]] = []
        self.failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        self.cluster: ClusterNode | None = None  # set by start() when `cluster` is configured
        self.handler: GroupingHandler | None = None  # set with the cluster, if configured
        from cluster.sending import Sender  # cluster/ imports this module

        self.sender: Sender = Sender(self)
        self.problems: list[str] = []  # cluster misconfigurations, as last seen
        self._problems_logged: list[str] = []
        self._quiet_until = 0.0  # problems are logged from then on (peers need time to link)
        self._health_update: asyncio.Future[None] | None = None
        self.audit = node_audit(config)  # audit log (broker/audit.py); None unless enabled

    @property
    def store(self) -> Store:
        assert self._store is not None, "node not started"
        return self._store

    # ---- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Open and replay the store, then serve; raises StartupError naming the culprit."""
        from pinmq.grpc_api import make_server, mark_serving  # server.py imports this module
        from pinmq.stomp.server import StompServer  # so does the STOMP shell

        if self.audit is not None:  # audit log: started first, stopped last
            try:
                self.audit.start()
            except OSError as err:
                raise StartupError(f"cannot write audit log {self.audit.dir}: {err}") from None
        try:
            self.store_path.parent.mkdir(parents=True, exist_ok=True)
            self._store = store = Store.open(self.store_path)
            for address, name, settings in store.load_queues():
                self.core.restore_queue(address, name, QueueConfig.model_validate(settings))
            messages = store.load_messages()
        except (StoreError, OSError, ValidationError) as err:
            raise StartupError(f"cannot open store {self.store_path}: {err}") from None
        orphans = self.core.restore_messages(messages, store.max_msg_id() + 1)
        try:
            self._server, self._health = make_server(self)
            self._stomp = StompServer(self)
            await self._stomp.start()
            self._http = HttpServer(self.config.listen.http, self.config.node.id, self.readiness)
            await self._http.start()
        except OSError as err:
            if self._stomp is not None:
                await self._stomp.stop(0)
            if self._server is not None:
                await self._server.stop(None)
            await self.store.close()
            raise StartupError(str(err)) from None
        await self._server.start()
        if self.config.cluster is not None:
            await self._start_cluster()
        await mark_serving(self._health)
        self._serving = True
        if self.cluster is not None:
            await self._set_cluster_health()
        self._tasks = [
            asyncio.create_task(self._tick_loop(), name="tick"),
            asyncio.create_task(self._backlog_loop(), name="deliver"),
        ]
        log.info(
            "node started",
            listen=self.config.listen.client,
            stomp=self.config.listen.stomp,
            http=self.config.listen.http,
            store=str(self.store_path),
            queues=len(self.core.queues()),
            messages=len(messages) - orphans,
            orphans=orphans,
        )

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, end consumer streams, let running calls finish, close the store."""
        log.info("node stopping")
        self._serving = False
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self.handler is not None:  # first: it ends its Removals streams on the cluster server
            await self.handler.stop()
        if self.cluster is not None:
            await self.cluster.stop()
        for stream in list(self.streams.values()):
            stream.end("UNAVAILABLE", "the node is shutting down")
        if self._stomp is not None:
            await self._stomp.stop(grace_s)
        if self._server is not None:
            await self._server.stop(grace_s)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._store is not None:
            await self._store.close()
        if self._http is not None:  # last: probes see "not ready" until the very end
            await self._http.stop()
        if self.audit is not None:
            self.audit.close()
        log.info("node stopped")

    async def _start_cluster(self) -> None:
        """Cluster connections (cluster/) and the grouping handler (handler/), wired together.

        The handler starts first, so its gRPC service answers as soon as listen.cluster does.
        """
        from cluster.node import ClusterNode  # cluster/ imports this module
        from handler.api import make_handler
        from handler.bindings import BindingStoreError

        self.cluster = cluster = ClusterNode(self)
        handler = make_handler(self.config, cluster.locate_local_handler)
        if handler is not None:
            try:
                await handler.start()
            except BindingStoreError as err:
                await self.stop(0)
                raise StartupError(str(err)) from None
            self.handler = handler
            cluster.add_servicer(handler.add_to_server)
            handler.on_removed(self._binding_removed)
            if self.config.grouping_handler.type == "LOCAL":  # type: ignore[union-attr]
                cluster.on_instances_changed(self._report_instances)
                if self.audit is not None:
                    handler.on_removed(self._audit_removal)
        cluster.on_instances_changed(self._topology_changed)
        reconnect_s = cluster.config.reconnect_interval / 1000
        self._quiet_until = time.monotonic() + max(2.0, 4 * reconnect_s)
        asyncio.get_running_loop().call_later(
            self._quiet_until - time.monotonic(), self._log_problems
        )
        try:
            await cluster.start()
        except OSError as err:
            await self.stop(0)
            raise StartupError(str(err)) from None

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
            fx = self.core.reset_groups(binding.queue, binding.group, now_ns())
        except CoreError:
            return  # no such queue or group here
        self.apply(fx)

    def _audit_removal(self, binding: Binding, reason: RemovalReason) -> None:
        """The LOCAL node's record of a removed binding: the checker then accepts a new one."""
        assert self.audit is not None
        self.audit.record(
            "unbound",
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
        self.sender.redistribute_all()

    def _log_problems(self) -> None:
        """Log cluster problems loudly when they change (after the start-up grace period)."""
        if time.monotonic() < self._quiet_until or self.problems == self._problems_logged:
            return
        if self.problems:
            log.error("cluster misconfigured", problems=self.problems)
        elif self._problems_logged:
            log.info("cluster problems resolved")
        self._problems_logged = self.problems

    async def _set_cluster_health(self) -> None:
        from grpc_health.v1 import health_pb2

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
        return assess(
            node_id=self.config.node.id,
            serving=self._serving,
            store_open=self._store is not None and self._store.is_open,
            failed=str(self.failed.result()) if self.failed.done() else None,
            clustered=self.config.cluster is not None,
            handler_type=handler.type if handler is not None and cluster is not None else None,
            local_handler=local_handler,
            peers=peers,
            problems=self.problems,
        )

    def fail(self, err: BaseException) -> None:
        """A fault the node cannot serve through (a store write failed): it must stop."""
        if not self.failed.done():
            log.error("fatal error, stopping", error=str(err))
            self.failed.set_result(err)

    # ---- effects --------------------------------------------------------------------------

    def apply(
        self,
        fx: Effects,
        receipt: tuple[ConsumerStream, Receipt] | None = None,
        marks: Mapping[str, int] | None = None,
    ) -> asyncio.Future[None] | None:
        """Carry out what a core call asked for; returns its store write, if there is one.

        Await the returned future before confirming the operation to a client. `marks`
        (forwarded messages, `cluster/bridge.py`) are stored in the same write as the messages.
        """
        if self.audit is not None:  # audit log: queues references, formats off the loop
            self.audit.effects(fx)
        for address, name, settings in fx.queues_created:
            if settings.durable:
                self._watch(self.store.save_queue(address, name, _settings(settings)))
            if self.cluster is not None:
                self.cluster.local_changed()
        added = [m for m in fx.added if m.persistent]
        removed = [m for m in fx.removed if m.persistent]
        updated = [m for m in fx.updated if m.persistent]
        write = None
        if added or removed or updated or marks:
            write = self._watch(
                self.store.write(added=added, removed=removed, updated=updated, marks=marks or {})
            )
            if added:
                self._track(added, write)
        if not fx.deliveries and receipt is None:
            return write
        # A delivery waits only for the write that adds its own message (from any earlier send).
        unwritten = self._unwritten
        waits = {unwritten.get(d.message.msg_id) for d in fx.deliveries} if unwritten else set()
        if receipt is not None:
            waits.add(write)
        gates = [f for f in waits if f is not None and not f.done()]
        if not gates and not self._backlog:
            self._push(fx.deliveries, receipt)
        else:
            self._backlog.append(_Step(gates, fx.deliveries, receipt))
            self._backlog_ready.set()
        return write

    def _track(self, added: list[Message], write: asyncio.Future[None]) -> None:
        """Remember which write makes each added message durable, until it has."""
        unwritten = self._unwritten
        for m in added:
            unwritten[m.msg_id] = write

        def written(_: asyncio.Future[None]) -> None:
            for m in added:
                if unwritten.get(m.msg_id) is write:
                    del unwritten[m.msg_id]

        write.add_done_callback(written)

    def _watch(self, write: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        """Start a store call now (it joins the next group commit); its failure is fatal."""
        future = asyncio.ensure_future(write)
        future.add_done_callback(self._check_write)
        return future

    def _check_write(self, future: asyncio.Future[None]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.fail(future.exception())  # type: ignore[arg-type]

    def _push(
        self, deliveries: list[Delivery], receipt: tuple[ConsumerStream, Receipt] | None
    ) -> None:
        streams = self.streams
        if deliveries:
            first = deliveries[0].consumer_id
            if all(d.consumer_id == first for d in deliveries):
                if (stream := streams.get(first)) is not None:
                    stream.outbound.put_nowait(deliveries)
            else:
                per: dict[str, list[Delivery]] = {}
                for d in deliveries:
                    per.setdefault(d.consumer_id, []).append(d)
                for consumer_id, batch in per.items():
                    if (stream := streams.get(consumer_id)) is not None:
                        stream.outbound.put_nowait(batch)
        # A consumer that is gone had its deliveries returned to the queue by close_consumer.
        if receipt is not None and receipt[0].consumer_id in streams:
            receipt[0].outbound.put_nowait(receipt[1])

    async def _backlog_loop(self) -> None:
        backlog = self._backlog
        while True:
            await self._backlog_ready.wait()
            self._backlog_ready.clear()
            while backlog:
                step = backlog[0]
                for gate in step.gates:
                    try:
                        await gate
                    except Exception:
                        return  # the node fails: nothing more goes out
                backlog.popleft()
                self._push(step.deliveries, step.receipt)

    async def _tick_loop(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(TICK_S)
            self.apply(self.core.tick(now_ns()))
            ticks += 1
            if self.cluster is not None and ticks % REDISTRIBUTE_TICKS == 0:
                self.sender.redistribute_all()

    # ---- consumers and queues ----------------------------------------------------------------

    def end_consumers(self, queue: str, code: str, reason: str) -> None:
        for stream in list(self.streams.values()):
            if stream.queue == queue:
                stream.end(code, reason)

    async def create_queue(self, address: str, name: str, settings: QueueConfig) -> None:
        self.core.create_queue(address, name, settings)
        if self.cluster is not None:
            self.cluster.local_changed()
        if settings.durable:
            await self._watch(self.store.save_queue(address, name, _settings(settings)))

    async def delete_queue(self, name: str) -> int:
        """Delete a queue and its messages; its consumers' streams end with NOT_FOUND.

        Bindings to it are removed cluster-wide, so its groups are proposed again.
        """
        removed = len(self.core.delete_queue(name).removed)
        self.end_consumers(name, "NOT_FOUND", f"queue {name!r} was deleted")
        if self.cluster is not None:
            self.cluster.local_changed()
        if self.handler is not None:
            self.handler.instance_deleted(name, self.config.node.id)
        await self._watch(self.store.delete_queue(name))  # drops its stored messages too
        return removed

    def consumers_changed(self, queue: str) -> None:
        """A consumer subscribed to or left `queue`: tell the cluster; maybe redistribute."""
        if self.cluster is None:
            return
        self.cluster.local_changed()
        with contextlib.suppress(CoreError):  # the queue was deleted meanwhile
            self.sender.redistribute(self.core.queue(queue))


async def serve(config: NodeConfig) -> int:
    """Run a node until SIGTERM/SIGINT (exit 0) or a fatal error (exit 1)."""
    loop = asyncio.get_running_loop()
    node = Node(config)
    try:
        await node.start()
    except StartupError as err:
        log.error("cannot start node", error=str(err))
        return 1
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([stopping, node.failed], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    await node.stop()
    return 1 if node.failed.done() else 0


def run_node(config: NodeConfig) -> int:
    """Entry point of `pinmq node`: configure logging, serve, return the exit code."""
    logs.configure(config.node.id, config.log.level, config.log.format)
    return asyncio.run(serve(config))
