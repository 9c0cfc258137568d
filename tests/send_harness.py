"""A clustered node's send path without I/O: an engine without a store (engine_harness.py), a
real `ClusterMember` whose topology the test feeds, and a grouping handler that answers what the
test scripted. Shared by the send path's tests and the audit log's `routed` tests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from engine_harness import RecordingEngine

from broker.core import BrokerCore
from broker.message import DUPLICATE_ID_HEADER, GROUP_ID_HEADER, Outgoing
from cluster.member import ClusterMember
from cluster.sending import ClusteredSendPath
from cluster.topology import NodeState
from handler.api import Binding, GroupingHandler

ME = "n1"


class ScriptedHandler(GroupingHandler):
    """Known bindings answer `cached`; `decide` records its calls and waits for `release`."""

    def __init__(self) -> None:
        super().__init__()
        self.bindings: dict[tuple[str, str], Binding] = {}
        self.calls: list[tuple[str, str, str]] = []
        self.release = asyncio.Event()
        self.release.set()
        self.fail: BaseException | None = None

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def cached(self, group: str, queue: str) -> Binding | None:
        return self.bindings.get((group, queue))

    async def decide(self, group: str, queue: str, proposal_node: str) -> Binding:
        self.calls.append((group, queue, proposal_node))
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        binding = self.bindings.setdefault((group, queue), Binding(group, queue, proposal_node, 1))
        return binding

    async def list_bindings(self, group: str | None = None, limit: int = 0) -> list[Any]:
        return []

    async def unbind(self, group: str, queue: str | None = None) -> int:
        return 0


def bind(handler: ScriptedHandler, group: str, queue: str, node: str) -> None:
    handler.bindings[(group, queue)] = Binding(group, queue, node, 1)


@dataclass
class Node:
    """The parts of a clustered node the send path works with."""

    engine: RecordingEngine
    cluster: ClusterMember
    sender: ClusteredSendPath

    @property
    def core(self) -> BrokerCore:
        return self.engine.core


def peers(node: Node, instances: dict[str, dict[str, dict[str, int]]], **handlers: str) -> None:
    """Announce and link peers: node id -> {address: {queue: consumers}}."""
    topology = node.cluster.topology
    for peer, held in instances.items():
        topology.update(NodeState(peer, f"{peer}:7701", handlers.get(peer), held, 1, 1))  # type: ignore[arg-type]
        topology.connected(peer)


def msg(
    body: str, group: str | None = None, address: str = "orders", dup: str | None = None
) -> Outgoing:
    headers = {GROUP_ID_HEADER: group} if group else {}
    if dup is not None:
        headers[DUPLICATE_ID_HEADER] = dup
    return Outgoing(address, body.encode(), headers, True)
