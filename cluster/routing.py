"""Clustered load balancing: which queue instance an ungrouped message (or a proposal) gets (pure).

Follows Artemis' cluster-connection `message-load-balancing`:
- `OFF`: the local instance only;
- `STRICT`: round robin over every instance, consumers or not;
- `ON_DEMAND`: round robin over the instances (local and remote) that have consumers, the
  local one first in the rotation; when none has consumers, the local instance.
"Local" may not exist yet; then `choose` answers None and the caller enqueues locally,
auto-creating the queue per address-settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from cluster.topology import Instance

Policy = Literal["OFF", "STRICT", "ON_DEMAND"]


class Router:
    """Round-robin positions per address; everything else is passed in."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def choose(
        self, address: str, instances: Sequence[Instance], policy: Policy, local_node: str
    ) -> Instance | None:
        """The instance to route to; None means "the local instance, created if missing".

        `instances` should be in a stable order (the topology gives local first, then by
        node and queue) so the round robin visits every instance in turn.
        """
        local = [i for i in instances if i.node == local_node]
        if policy == "OFF":
            return self._round_robin(address, local) if local else None
        if policy == "STRICT":
            return self._round_robin(address, instances) if instances else None
        if policy != "ON_DEMAND":
            raise ValueError(f"unknown load-balancing policy {policy!r}")
        busy = [i for i in instances if i.consumers > 0]
        if busy:
            return self._round_robin(address, busy)
        return self._round_robin(address, local) if local else None

    def forget(self, address: str) -> None:
        """Drop an address's position (it has no instances left anywhere)."""
        self._next.pop(address, None)

    def _round_robin(self, address: str, candidates: Sequence[Instance]) -> Instance:
        n = self._next.get(address, 0) % len(candidates)
        self._next[address] = n + 1
        return candidates[n]
