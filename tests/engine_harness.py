"""An engine without a store, for unit tests of what sits above the engine (the send paths).

Its units are the real `Unit` over a real `BrokerCore`; only their commit differs: the
Effects are recorded instead of carried out, so a test can look at what a command did.
Tests of the engine itself use the real `Engine` on a temporary data directory.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.audit import AuditLog
from broker.config import NodeConfig
from broker.core import BrokerCore
from broker.effects import Effects
from broker.engine import QueueView
from broker.message import Outgoing
from broker.sending import SendPath
from broker.streams import Outlets, ReceiptFor
from broker.unit import Unit


class RecordingEngine:
    """`LocalEngine` over a bare core: `applied` holds every committed unit's Effects."""

    def __init__(self, config: NodeConfig | BrokerCore, audit: AuditLog | None = None) -> None:
        self.core = config if isinstance(config, BrokerCore) else BrokerCore(config)
        self.config = self.core.config
        self.audit = audit  # the units' audit log: their `routed` and `moved` events
        self.applied: list[Effects] = []
        self._outlets = Outlets(lambda: True)

    def unit(self) -> Unit:
        return Unit(self.core, self._outlets, self._record, lambda queue: None, self.audit)

    def _record(self, fx: Effects, receipts: list[ReceiptFor], marks: object) -> None:
        self.applied.append(fx)

    def taken(self) -> Effects:
        """Everything applied since the last call, as one Effects."""
        total = Effects()
        for fx in self.applied:
            total.merge(fx)
        self.applied.clear()
        return total

    def queue(self, name: str) -> QueueView:
        return self.core.queue(name)

    def queues(self) -> list[QueueView]:
        return list(self.core.queues())

    def queues_of(self, address: str) -> list[QueueView]:
        return list(self.core.queues_of(address))

    def check_address(self, address: str) -> None:
        self.core.check_address(address)

    def store_id(self) -> int:
        return 1

    def forward_marks(self) -> dict[str, int]:
        return {}


def send_now(
    engine: RecordingEngine, path: SendPath, batch: Sequence[Outgoing], now: int
) -> tuple[list[int], Effects] | None:
    """`path.send_now` in a unit of its own: (msg ids, its Effects), or None (nothing done)."""
    with engine.unit() as unit:
        ids = path.send_now(batch, unit, now)
    return None if ids is None else (ids, engine.taken())


async def send(
    engine: RecordingEngine, path: SendPath, batch: Sequence[Outgoing]
) -> tuple[list[int], Effects]:
    """`path.send` in a unit of its own: (msg ids, its Effects)."""
    with engine.unit() as unit:
        ids = await path.send(batch, unit)
    return ids, engine.taken()
