"""What one node knows about the cluster: every node's queue instances and reachability (pure).

Nodes announce their own `NodeState` to their peers (gossip); `Topology` keeps the newest one
of each node, whether it is connected now, and answers the questions routing and the grouping
handlers ask. No I/O and no clock: the shell passes `now_ns` where time matters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

HandlerType = Literal["LOCAL", "REMOTE"]
Instances = Mapping[str, Mapping[str, int]]  # address -> queue -> consumer count

_COUNT_WORDS = ("no", "one", "two", "three", "four", "five")


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node's own announcement.

    `(incarnation, version)` orders the announcements of one node: a restart picks a higher
    incarnation (its start time), every change within an incarnation a higher version, so a
    stale state that arrives late over a second connection never overwrites a newer one.
    """

    node_id: str
    cluster_address: str
    handler: HandlerType | None = None
    instances: Instances = field(default_factory=dict)
    version: int = 0
    incarnation: int = 0

    def newer_than(self, other: NodeState) -> bool:
        return (self.incarnation, self.version) > (other.incarnation, other.version)

    def same_content(self, other: NodeState) -> bool:
        """Equal apart from the ordering counters (nothing a reader would notice changed)."""
        return (
            self.cluster_address == other.cluster_address
            and self.handler == other.handler
            and _plain(self.instances) == _plain(other.instances)
        )


@dataclass(frozen=True, slots=True)
class Instance:
    """A queue on one node (`queue@node`): a routing target."""

    queue: str
    node: str
    consumers: int
    local: bool
    address: str = ""

    def __str__(self) -> str:
        return f"{self.queue}@{self.node}"


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as the topology sees it, for health and inspection."""

    state: NodeState
    connected: bool
    local: bool
    down_since_ns: int | None


@dataclass(slots=True)
class _Entry:
    state: NodeState
    connected: bool
    down_since_ns: int | None = None


class Topology:
    """The newest known state of every node, the local one included."""

    def __init__(self, local_id: str) -> None:
        self.local_id = local_id
        self._nodes: dict[str, _Entry] = {}

    # ---- changes --------------------------------------------------------------------------

    def update(self, state: NodeState) -> bool:
        """Take a node's announcement if it is newer; True when routing-relevant data changed.

        An announcement of the local node counts as connected; a peer's announcement does not
        change its connectivity (the shell reports that with `connected` / `disconnected`).
        """
        entry = self._nodes.get(state.node_id)
        if entry is None:
            local = state.node_id == self.local_id
            self._nodes[state.node_id] = _Entry(state, connected=local)
            return True
        if not state.newer_than(entry.state):
            return False
        changed = not state.same_content(entry.state)
        entry.state = state
        return changed

    def connected(self, node_id: str) -> bool:
        """A link to `node_id` is up; True if that is news. Unknown nodes are ignored."""
        entry = self._nodes.get(node_id)
        if entry is None or entry.connected:
            return False
        entry.connected = True
        entry.down_since_ns = None
        return True

    def disconnected(self, node_id: str, now_ns: int) -> bool:
        """The last link to `node_id` went down; its instances stop being routing targets."""
        entry = self._nodes.get(node_id)
        if entry is None or not entry.connected or node_id == self.local_id:
            return False
        entry.connected = False
        entry.down_since_ns = now_ns
        return True

    def forget(self, node_id: str) -> bool:
        """Drop a peer altogether (e.g. removed from the cluster by an operator)."""
        if node_id == self.local_id:
            return False
        return self._nodes.pop(node_id, None) is not None

    # ---- questions ------------------------------------------------------------------------

    def state(self, node_id: str) -> NodeState | None:
        entry = self._nodes.get(node_id)
        return entry.state if entry is not None else None

    def is_connected(self, node_id: str) -> bool:
        entry = self._nodes.get(node_id)
        return entry is not None and entry.connected

    def instances(self, address: str, *, include_down: bool = False) -> list[Instance]:
        """Instances of `address`, local first, then by node id and queue name.

        Instances on disconnected peers are left out unless `include_down`: a message routed
        there would only wait, so ungrouped traffic goes to the instances that can take it.
        """
        found: list[Instance] = []
        for node_id in self._order():
            entry = self._nodes[node_id]
            if not (entry.connected or include_down):
                continue
            queues = entry.state.instances.get(address)
            if not queues:
                continue
            local = node_id == self.local_id
            for queue in sorted(queues):
                found.append(Instance(queue, node_id, queues[queue], local, address))
        return found

    def has_instance(self, queue: str, node_id: str) -> bool:
        """Whether `queue@node_id` exists on a connected node (a grouping binding may use it)."""
        entry = self._nodes.get(node_id)
        if entry is None or not entry.connected:
            return False
        return any(queue in queues for queues in entry.state.instances.values())

    def local_handler(self) -> tuple[str, str] | None:
        """(node id, cluster address) of the one LOCAL grouping handler; None if not exactly one.

        Disconnected nodes count: a REMOTE handler keeps asking the LOCAL node while it is down
        instead of forgetting where it is.
        """
        found = self._handlers("LOCAL")
        if len(found) != 1:
            return None
        state = self._nodes[found[0]].state
        return state.node_id, state.cluster_address

    def problems(self) -> list[str]:
        """Cluster-wide misconfigurations an operator must fix, one sentence each."""
        problems: list[str] = []
        local = self._handlers("LOCAL")
        if len(local) > 1:
            count = _COUNT_WORDS[len(local)] if len(local) < len(_COUNT_WORDS) else len(local)
            problems.append(f"{count} LOCAL grouping handlers: {', '.join(local)}")
        elif not local and self._handlers("REMOTE"):
            problems.append("no LOCAL grouping handler")
        return problems

    def nodes(self) -> list[NodeView]:
        """Every known node, local first, then by id."""
        return [
            NodeView(e.state, e.connected, node_id == self.local_id, e.down_since_ns)
            for node_id in self._order()
            for e in (self._nodes[node_id],)
        ]

    def peers(self) -> list[str]:
        """Ids of the known nodes other than this one."""
        return [n for n in self._order() if n != self.local_id]

    def _order(self) -> list[str]:
        others = sorted(n for n in self._nodes if n != self.local_id)
        return [self.local_id, *others] if self.local_id in self._nodes else others

    def _handlers(self, kind: HandlerType) -> list[str]:
        return [n for n in self._order() if self._nodes[n].state.handler == kind]


def _plain(instances: Instances) -> dict[str, dict[str, int]]:
    return {a: dict(q) for a, q in instances.items() if q}
