"""Gossip links: one bidirectional stream per pair of nodes carries both nodes' states.

A node dials each of its connectors (`run_connector`) and re-dials every reconnect-interval
while the peer is away; the peer serves the same stream (`GossipLink.serve`). Whichever side
opened it, a link sends this node's state first and then every change (only the newest state
is ever queued, so bursts coalesce), and hands every state it reads to the `ClusterMember`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc
from grpc import aio

from broker import channels, logs
from broker.config import ClusterSection
from cluster.outage import Outage, raise_if_cancelled
from cluster.topology import HandlerType, NodeState
from pinmq_pb import cluster_pb2 as pb
from pinmq_pb import cluster_pb2_grpc as pb_grpc

log = logs.get("cluster")

# Keepalive pings find a peer that stopped answering without closing its sockets (frozen,
# hung, cut off): its link fails within two keepalive intervals (broker/channels.py).
CHANNEL_OPTIONS = [
    # Own subchannels: a failed dial by another channel (gRPC shares them process-wide by
    # default) must not hold this one in backoff; the callers retry every reconnect-interval.
    ("grpc.use_local_subchannel_pool", 1),
    *channels.keepalive(),
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]
SERVER_OPTIONS = [
    *channels.serve_keepalive(),
    ("grpc.max_receive_message_length", -1),
    ("grpc.so_reuseport", 0),  # a second node on the same port must fail, not share it
]

_HANDLER_TO_PB = {None: pb.HANDLER_NONE, "LOCAL": pb.HANDLER_LOCAL, "REMOTE": pb.HANDLER_REMOTE}
_HANDLER_FROM_PB: dict[int, HandlerType | None] = {v: k for k, v in _HANDLER_TO_PB.items()}


class LinkRefused(Exception):
    """The other end is not a peer we may link with (other cluster, our own id, bad data)."""


class SelfLink(LinkRefused):
    """A connector leads back to this node (or to another node with the same id)."""


def state_to_pb(state: NodeState, cluster_name: str) -> pb.NodeState:
    return pb.NodeState(
        cluster_name=cluster_name,
        node_id=state.node_id,
        cluster_address=state.cluster_address,
        handler=_HANDLER_TO_PB[state.handler],
        instances=[
            pb.QueueInstance(address=address, queue=queue, consumers=consumers)
            for address, queues in sorted(state.instances.items())
            for queue, consumers in sorted(queues.items())
        ],
        incarnation=state.incarnation,
        version=state.version,
    )


def state_from_pb(msg: pb.NodeState) -> NodeState:
    instances: dict[str, dict[str, int]] = {}
    for i in msg.instances:
        instances.setdefault(i.address, {})[i.queue] = i.consumers
    return NodeState(
        node_id=msg.node_id,
        cluster_address=msg.cluster_address,
        handler=_HANDLER_FROM_PB.get(msg.handler),
        instances=instances,
        version=msg.version,
        incarnation=msg.incarnation,
    )


class GossipHost(Protocol):
    """What a gossip link needs of the cluster member it belongs to (`cluster/member.py`)."""

    node_id: str
    config: ClusterSection
    stopping: bool

    @property
    def local_state(self) -> NodeState: ...

    def dial(self, address: str, options: channels.Options) -> aio.Channel: ...

    def attach(self, link: GossipLink) -> None: ...

    def detach(self, link: GossipLink) -> None: ...

    def link_up(self, link: GossipLink, state: NodeState) -> None: ...

    def peer_state(self, link: GossipLink, state: NodeState) -> None: ...

    def refused(self, reason: str) -> None: ...


class GossipLink:
    """One gossip stream; `via` is the connector address when this node dialled it."""

    def __init__(self, cluster: GossipHost, via: str | None) -> None:
        self.cluster = cluster
        self.via = via
        self.peer: str | None = None
        self._latest: NodeState | None = None
        self._wake = asyncio.Event()

    def offer(self, state: NodeState) -> None:
        """Queue our newest state for sending; an older unsent one is simply replaced."""
        self._latest = state
        self._wake.set()

    async def dial(self, call: aio.StreamStreamCall) -> None:
        """Client side: announce ourselves, then read the peer's state and its changes."""
        await self._run(call.read, call.write, first=None)

    async def serve(self, context: aio.ServicerContext) -> None:
        """Server side: the dialling peer speaks first; we answer with our state."""
        first = await context.read()
        if first is aio.EOF:
            return
        cluster = self.cluster
        if first.node_id == cluster.node_id and first.cluster_name == cluster.config.name:
            # Dialled by ourselves: answer with our state, so the dialler sees it and gives up.
            await context.write(state_to_pb(cluster.local_state, cluster.config.name))
            return
        try:
            self._check(first)
        except LinkRefused as err:
            self.cluster.refused(str(err))
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        await self._run(context.read, context.write, first=first)

    async def _run(
        self,
        read: Callable[[], Awaitable[Any]],
        write: Callable[[pb.NodeState], Awaitable[None]],
        first: pb.NodeState | None,
    ) -> None:
        cluster = self.cluster
        cluster.attach(self)  # from now on every change of ours is offered to this link
        sender = asyncio.create_task(self._send(write))
        reading: asyncio.Future[Any] | None = None
        try:
            if first is None:
                first = await read()
                if first is aio.EOF:
                    return
                self._check(first)
            self.peer = first.node_id
            cluster.link_up(self, state_from_pb(first))
            while True:
                reading = asyncio.ensure_future(read())
                await asyncio.wait([reading, sender], return_when=asyncio.FIRST_COMPLETED)
                if sender.done():
                    sender.result()  # raises what ended it
                msg = reading.result()
                reading = None
                if msg is aio.EOF:
                    return
                if msg.node_id != self.peer:
                    raise LinkRefused(f"peer {self.peer} suddenly calls itself {msg.node_id!r}")
                cluster.peer_state(self, state_from_pb(msg))
        finally:
            # Detach before awaiting anything: a second cancellation of this task (gRPC ending
            # the call while it unwinds) would cut the finally short and leave the peer
            # connected for good. A pending read is cancelled and collected too: left alone it
            # would fail when the channel closes, with nobody to retrieve its error.
            sender.cancel()
            if reading is not None:
                reading.cancel()
            cluster.detach(self)
            await asyncio.gather(sender, *([reading] if reading else []), return_exceptions=True)

    async def _send(self, write: Callable[[pb.NodeState], Awaitable[None]]) -> None:
        name = self.cluster.config.name
        while True:
            await self._wake.wait()
            self._wake.clear()
            state = self._latest
            if state is not None:
                await write(state_to_pb(state, name))

    def _check(self, msg: pb.NodeState) -> None:
        cluster = self.cluster
        if msg.cluster_name != cluster.config.name:
            raise LinkRefused(
                f"cluster name mismatch: node {msg.node_id!r} is in cluster "
                f"{msg.cluster_name!r}, node {cluster.node_id!r} in {cluster.config.name!r}"
            )
        if not msg.node_id:
            raise LinkRefused("a peer announced an empty node id")
        if msg.node_id == cluster.node_id:
            raise SelfLink(
                f"{self.via or 'an incoming link'} answers with this node's own id "
                f"{msg.node_id!r}: it is this node, or another node has the same id"
            )


async def run_connector(cluster: GossipHost, address: str) -> None:
    """Keep one gossip link to `address` up, re-dialling every reconnect-interval."""
    interval = cluster.config.reconnect_interval / 1000
    outage = Outage()  # a long outage logs each of its failures once
    while True:
        link = GossipLink(cluster, via=address)
        try:
            async with cluster.dial(address, CHANNEL_OPTIONS) as channel:
                call = pb_grpc.ClusterStub(channel).Gossip()
                try:
                    await link.dial(call)
                finally:
                    call.cancel()
            reason = "the peer closed the link"
        except SelfLink as err:
            log.warning("cluster connector skipped", connector=address, reason=str(err))
            return
        except LinkRefused as err:
            reason = str(err)
        except grpc.RpcError as err:
            code = err.code()
            reason = f"{code.name if code else 'UNKNOWN'}: {err.details()}"
        raise_if_cancelled()  # the node stops: grpcio may have called that a failure
        if link.peer is not None:
            outage.over()
        if outage.news(reason) and not cluster.stopping:
            if "ping timeout" in reason:  # open sockets, no answer: frozen, hung or cut off
                log.warning(
                    "cluster peer not answering",
                    connector=address,
                    peer=link.peer,
                    reason=f"{reason} (no answer to a keepalive ping)",
                )
            else:
                log.info("cluster connector down", connector=address, peer=link.peer, reason=reason)
        await asyncio.sleep(interval)
