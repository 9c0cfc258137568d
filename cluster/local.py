"""What the cluster needs of its own node's engine, as an interface.

The node process passes its engine (`broker/engine.py`), which has all of this; tests may pass
anything that has it too. The cluster changes its node only through the engine's commands
(`unit()`) and, when it may no longer deliver a group, by ending consumers' streams; the rest
is read-only.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from broker.config import NodeConfig
from broker.engine import QueueView
from broker.unit import Unit


class LocalEngine(Protocol):
    """This node's engine as the cluster uses it: commands, and read-only queries."""

    config: NodeConfig

    def unit(self) -> Unit: ...

    def queue(self, name: str) -> QueueView:
        """Raises CoreError if there is none."""
        ...

    def queues(self) -> list[QueueView]: ...

    def queues_of(self, address: str) -> list[QueueView]: ...

    def end_consumers(self, consumer_ids: Collection[str], reason: str) -> None: ...

    def check_address(self, address: str) -> None:
        """Raises CoreError unless a send to `address` would be routed to a queue."""
        ...

    def store_id(self) -> int:
        """The store's identity: forwarding marks are per origin store."""
        ...

    def forward_marks(self) -> dict[str, int]:
        """Per origin, the highest forwarded sequence this node holds (`cluster/bridge.py`)."""
        ...
