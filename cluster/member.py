"""`ClusterMember`: a node as a member of its cluster, built by the node process when
`cluster` is set (its engine is the node's core; an ha pair's logical node is `cluster/ha.py`).

It owns the cluster gRPC server on `listen.cluster` (the Cluster service, plus whatever
`add_servicer` registers, e.g. the grouping handler), one gossip link per connector, the
`Topology` built from gossip, the `Router`, and a `Bridge` per peer with waiting messages.

This node's own state is recomputed from the engine's queues when `local_changed()` is
called and, as a safety net for changes nobody reported, every `POLL_S`; bursts of changes
coalesce into one announcement. Everything runs on the node's event loop, like the rest of the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from grpc import aio

from broker import channels, logs
from broker.config import ClusterSection
from broker.message import Outgoing
from broker.unit import Placement
from cluster.bridge import (
    COUNT_HEADER,
    FORWARD_HEADER,
    SF_PREFIX,
    SF_SETTINGS,
    Admission,
    Bridge,
    ForwardReceiver,
    sf_queue,
)
from cluster.connector import SERVER_OPTIONS, GossipLink, run_connector
from cluster.ha import PairShell, VoterRegistry
from cluster.local import LocalEngine
from cluster.node_certificates import cluster_server
from cluster.replication import Replicator
from cluster.routing import Router
from cluster.service import ClusterService
from cluster.topology import Instance, NodeState, Topology
from pinmq_pb import cluster_pb2_grpc as pb_grpc

log = logs.get("cluster")

POLL_S = 0.25  # unreported local changes (e.g. a consumer subscribed) are announced this late
COALESCE_S = 0.05  # announcements at most this often (each carries the full state)
STOP_GRACE_S = 0.5

Callback = Callable[[Topology], None]


class ClusterMember:
    """The cluster side of one node. Create, `add_servicer(...)`, then `await start(...)`.

    `pair`: the ha pair's failover shell, when this node is a pair's active process.
    """

    def __init__(self, engine: LocalEngine, pair: PairShell | None = None) -> None:
        config = engine.config.cluster
        if config is None:
            raise ValueError("the node has no cluster section")
        self.engine = engine
        self.config: ClusterSection = config
        self.node_id = engine.config.node.id
        self.listen = engine.config.listen.cluster  # bound
        self.address = engine.config.cluster_address  # named to peers: cluster.advertise, or bound
        self.tls = engine.config.tls_files  # mutual TLS with every peer, when set
        handler = engine.config.grouping_handler
        self.handler_type = handler.type if handler is not None else None
        self.topology = Topology(self.node_id)
        self.router = Router()
        self.receiver = ForwardReceiver(self)
        self.pair = pair
        self.admission: Admission | None = None  # given to start(): the group claims
        self.replicator: Replicator | None = None  # given to start(): an ha primary's
        self.voters = VoterRegistry(Path(engine.config.node.data_dir))  # votes for ha pairs
        self.store_id = 0
        self._incarnation = time.time_ns()
        self._version = 0
        self._local = NodeState(
            self.node_id, self.address, self.handler_type, {}, 0, self._incarnation
        )
        self.topology.update(self._local)
        self._server = cluster_server(self.tls, SERVER_OPTIONS)
        self._servicers: list[Callable[[aio.Server], None]] = []
        self._started = False
        self.stopping = False  # links ending now are this node's own doing: not news to log
        self._links: set[GossipLink] = set()
        self._peer_links: dict[str, set[GossipLink]] = {}
        self._dialled: dict[str, str] = {}  # peer id -> the connector address that reached it
        self._bridges: dict[str, Bridge] = {}
        self._callbacks: list[Callback] = []
        self._refusals: set[str] = set()
        self._streams: set[asyncio.Task[object]] = set()  # server-side gossip/forward calls
        self._local_dirty = asyncio.Event()
        self._change = asyncio.Event()  # replaced (after being set) on every topology change
        self._tasks: list[asyncio.Task[None]] = []

    def dial(self, address: str, options: channels.Options) -> aio.Channel:
        """A channel to a peer's listen.cluster: mutual TLS when the node has `tls`."""
        return channels.dial(address, options, self.tls)

    # ---- lifecycle --------------------------------------------------------------------------

    def add_servicer(self, add: Callable[[aio.Server], None]) -> None:
        """Host another service on listen.cluster: `add(server)` registers it (before start)."""
        if self._started:
            raise RuntimeError("add_servicer must be called before start()")
        self._servicers.append(add)

    async def start(
        self, admission: Admission | None = None, replicator: Replicator | None = None
    ) -> None:
        """Listen on listen.cluster, then dial the connectors; OSError if the port is taken.

        What it serves from then on: `admission`, where forwarded messages go first (the group
        claims, with grouping on); `replicator`, an ha primary's replication to its backup.
        """
        self.admission, self.replicator = admission, replicator
        pb_grpc.add_ClusterServicer_to_server(ClusterService(self), self._server)
        for add in self._servicers:
            add(self._server)
        try:
            # Mutual TLS: only the cluster's own nodes (certificates of its CA) get in.
            channels.listen(self._server, self.listen, self.tls, client_cert=True)
        except RuntimeError:
            raise OSError(
                f"cannot listen on {self.listen} (listen.cluster in use or not a local address)"
            ) from None
        self.store_id = self.engine.store_id()
        self.receiver.load(self.engine.forward_marks())
        await self._server.start()
        self._started = True
        self._publish()
        self._tasks = [asyncio.create_task(self._announce_loop(), name="cluster-announce")]
        for address in dict.fromkeys(self.config.connectors):
            if address not in (self.address, self.listen):
                self._tasks.append(
                    asyncio.create_task(run_connector(self, address), name=f"connector:{address}")
                )
        prefix = sf_queue(self.config.name, "")
        for q in self.engine.queues():
            if q.name.startswith(prefix):
                self._bridge(q.name[len(prefix) :])
        log.info(
            "cluster started",
            listen=self.listen,
            advertised=self.address,
            cluster=self.config.name,
            connectors=list(self.config.connectors),
            waiting_bridges=sorted(self._bridges),
        )

    async def stop(self) -> None:
        """Stop serving peers, return in-flight forwarded messages to their queues, hang up."""
        self.stopping = True
        if self._started:
            # Gossip and forward streams never end on their own: cancel them rather than
            # wait out the grace period that other services' short calls may still use.
            for task in list(self._streams):
                task.cancel()
            await self._server.stop(STOP_GRACE_S)
        await asyncio.gather(*(b.stop() for b in list(self._bridges.values())))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    # ---- what the node and the grouping handlers use ------------------------------------------

    def local_changed(self) -> None:
        """A local queue or consumer count changed: announce it soon (coalesced)."""
        self._local_dirty.set()

    def choose(self, address: str, queue: str | None = None) -> Instance | None:
        """The instance an ungrouped message for `address` goes to (see `Router.choose`).

        With `queue`, only instances of that queue take part (a multicast address routes each
        of its queues on its own, with its own round robin). None: enqueue locally, creating
        the queue per address-settings. Local instances are read from the core now, so a
        consumer that just subscribed here counts at once.
        """
        policy = self.config.load_balancing if self.config.covers(address) else "OFF"
        local = [
            Instance(q.name, self.node_id, q.consumer_count, True, address)
            for q in self.engine.queues_of(address)
            if queue is None or q.name == queue
        ]
        remote = [
            i
            for i in self.topology.instances(address)
            if not i.local and (queue is None or i.queue == queue)
        ]
        key = address if queue is None else f"{address}\x00{queue}"
        return self.router.choose(key, local + remote, policy, self.node_id)

    def forwarding(self, node_id: str, queue: str, m: Outgoing) -> Placement:
        """Where `m` waits on its way to `queue@node_id`: that node's store-and-forward queue
        (created on demand, `Unit.place`), whose bridge starts if needed.

        The copy names its target queue, and the deliveries it already had here (a moved
        group), so it stays flagged as a redelivery there.
        """
        if node_id == self.node_id:
            raise ValueError("forwarding() is for other nodes; place local messages directly")
        headers = {**m.headers, FORWARD_HEADER: queue}
        if m.delivery_count:
            headers[COUNT_HEADER] = str(m.delivery_count)
        copy = Outgoing(m.address, m.body, headers, m.persistent)
        self._bridge(node_id)
        return Placement(sf_queue(self.config.name, node_id), copy, SF_SETTINGS)

    def locate_local_handler(self) -> str | None:
        """Cluster address of the node with the LOCAL grouping handler, from gossip."""
        found = self.topology.local_handler()
        if found is None:
            return None
        node_id, _ = found
        return self.address if node_id == self.node_id else self.peer_address(node_id)

    def problems(self) -> list[str]:
        """Cluster misconfigurations for health reports (see `Topology.problems`)."""
        return self.topology.problems()

    def on_instances_changed(self, callback: Callback) -> Callable[[], None]:
        """Call `callback(topology)` after every change of instances or reachability.

        Returns a function that unregisters it. Callbacks run on the event loop and must not
        block; an exception is logged and does not stop the others.
        """
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback)

    def peer_address(self, node_id: str) -> str | None:
        """How to reach a peer: a connector whose link to it is up, else the address it
        announced. A connector's address is forgotten when its link goes down: after an ha
        pair's failover it reaches the fenced process, which serves no forwarding."""
        if node_id in self._dialled:
            return self._dialled[node_id]
        state = self.topology.state(node_id)
        return state.cluster_address if state is not None else None

    @property
    def local_state(self) -> NodeState:
        """This node's state as last announced."""
        return self._local

    def bridges(self) -> dict[str, Bridge]:
        return dict(self._bridges)

    async def reachable(self, node_id: str) -> str:
        """Wait until `node_id` is connected by gossip; its address."""
        while True:
            address = self.peer_address(node_id)
            if address is not None and self.topology.is_connected(node_id):
                return address
            await self._change.wait()

    # ---- gossip links (called by GossipLink) ----------------------------------------------

    def attach(self, link: GossipLink) -> None:
        self._links.add(link)
        link.offer(self._local)

    def detach(self, link: GossipLink) -> None:
        self._links.discard(link)
        peer = link.peer
        links = self._peer_links.get(peer) if peer is not None else None
        if peer is None or links is None or link not in links:
            return
        links.discard(link)
        if link.via is not None and self._dialled.get(peer) == link.via:
            # That connector no longer reaches the peer: another live one may, else its
            # announced address (an ha pair's new active process announces its own).
            dialled = [other.via for other in links if other.via is not None]
            if dialled:
                self._dialled[peer] = dialled[0]
            else:
                del self._dialled[peer]
        if not links:
            del self._peer_links[peer]
            if self.topology.disconnected(peer, time.time_ns()):
                if not self.stopping:
                    log.info("cluster peer disconnected", peer=peer)
                self._changed()

    def link_up(self, link: GossipLink, state: NodeState) -> None:
        peer = state.node_id
        self._peer_links.setdefault(peer, set()).add(link)
        if link.via is not None:
            self._dialled[peer] = link.via
        changed = self.topology.update(state)
        if self.topology.connected(peer):
            log.info("cluster peer connected", peer=peer, address=link.via or state.cluster_address)
            changed = True
        if changed:
            self._changed()

    def peer_state(self, link: GossipLink, state: NodeState) -> None:
        if self.topology.update(state):
            self._changed()

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Marks a long-lived server-side stream, so `stop` can end it at once."""
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        try:
            yield
        finally:
            self._streams.discard(task)

    def refused(self, reason: str) -> None:
        """An incoming link was refused; said once per reason, as the peer retries forever."""
        if reason not in self._refusals:
            self._refusals.add(reason)
            log.warning("cluster link refused", reason=reason)

    def bridge_ended(self, bridge: Bridge) -> None:
        if self._bridges.get(bridge.peer) is bridge:
            del self._bridges[bridge.peer]

    # ---- internals ----------------------------------------------------------------------------

    def _bridge(self, node_id: str) -> None:
        """Start forwarding to `node_id`; not once stopping: `stop` has stopped the bridges
        it found, and one started after would be left running (its messages wait in their
        store-and-forward queue for the next start)."""
        if self.stopping:
            return
        if node_id not in self._bridges and self._started and node_id != self.node_id:
            bridge = self._bridges[node_id] = Bridge(self, node_id)
            bridge.start()

    def _snapshot(self) -> dict[str, dict[str, int]]:
        covers = self.config.covers
        instances: dict[str, dict[str, int]] = {}
        for q in self.engine.queues():
            if covers(q.address) and not q.name.startswith(SF_PREFIX):
                instances.setdefault(q.address, {})[q.name] = q.consumer_count
        return instances

    def _publish(self) -> None:
        """Recompute our own state; announce it to every link if it changed."""
        instances = self._snapshot()
        if instances == self._local.instances:
            return
        self._version += 1
        self._local = NodeState(
            self.node_id,
            self.address,
            self.handler_type,
            instances,
            self._version,
            self._incarnation,
        )
        self.topology.update(self._local)
        for link in self._links:
            link.offer(self._local)
        self._changed()

    async def _announce_loop(self) -> None:
        dirty = self._local_dirty
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_S):  # wait_for (3.11) may swallow a stop
                    await dirty.wait()
            dirty.clear()
            self._publish()
            await asyncio.sleep(COALESCE_S)

    def _changed(self) -> None:
        change, self._change = self._change, asyncio.Event()
        change.set()
        for callback in list(self._callbacks):
            try:
                callback(self.topology)
            except Exception:
                log.exception("on_instances_changed callback failed")
