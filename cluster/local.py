"""What the cluster needs of its own node, as an interface: the cluster never imports the node.

The node process passes its engine (`broker/engine.py`), which has all of this; tests may pass
anything that has it too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from broker.audit import AuditLog
from broker.config import NodeConfig
from broker.core import BrokerCore
from broker.effects import Effects
from broker.engine import ConsumerStream, Receipt
from broker.store import Store


class LocalNode(Protocol):
    """The core and store of this node, its consumer streams, and how effects are applied."""

    config: NodeConfig
    core: BrokerCore
    streams: dict[str, ConsumerStream]
    audit: AuditLog | None

    @property
    def store(self) -> Store: ...

    def apply(
        self,
        fx: Effects,
        receipt: tuple[ConsumerStream, Receipt] | None = None,
        marks: Mapping[str, int] | None = None,
    ) -> asyncio.Future[None] | None: ...
