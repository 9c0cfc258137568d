"""The seam between the protocol shells and the send path: one interface, two implementations.

A shell (gRPC, STOMP) turns what a client sent into `Outgoing` messages and hands a batch to
the node's `SendPath` with a `Unit` of the engine (`broker/unit.py`); it never knows whether
the node is clustered. `LocalSendPath` is a standalone node's: the core routes every message
by its address. The clustered one (`cluster/sending.py`) places messages on queue instances
across the cluster and may have to await a grouping decision first, which is why `send_now`
may answer None.

Both route through `Unit.route`, the one place where a node accepts what a client sent it:
messages carrying an `_AMQ_DUPL_ID` the address accepted lately are dropped there and
answered as sent. Messages another node forwards never come this way: the node a client sent
to decided already, and forwarding has its own exactly-once marks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from broker.clock import now_ns
from broker.message import Outgoing
from broker.unit import Unit


class SendPath(Protocol):
    """Routes a batch all or nothing into `unit`, whose commit confirms the send."""

    def send_now(self, batch: Sequence[Outgoing], unit: Unit, now_ns: int) -> list[int] | None:
        """Route now: one msg id per message; None (nothing done) when a decision must be
        awaited with `send`."""
        ...

    async def send(self, batch: Sequence[Outgoing], unit: Unit) -> list[int]:
        """Await whatever the batch needs, then route all of it, with no await after the
        routing: commit `unit` before awaiting anything else."""
        ...


class LocalSendPath:
    """A standalone node's send path: the core routes every message to its local queues."""

    def send_now(self, batch: Sequence[Outgoing], unit: Unit, now_ns: int) -> list[int]:
        ids = unit.route(batch, None, now_ns)
        assert ids is not None  # the core's own routing awaits nothing
        return ids

    async def send(self, batch: Sequence[Outgoing], unit: Unit) -> list[int]:
        return self.send_now(batch, unit, now_ns())
