"""The seam between the protocol shells and the send path: one interface, two implementations.

A shell (gRPC, STOMP) turns what a client sent into `Outgoing` messages and hands a batch to
the node's `SendPath`; it never knows whether the node is clustered. `LocalSendPath` is a
standalone node's: every message goes through `BrokerCore.send`. The clustered one
(`cluster/sending.py`) routes to queue instances across the cluster and may have to await a
grouping decision first, which is why `send_now` may answer None.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from broker.clock import now_ns
from broker.core import BrokerCore
from broker.effects import Effects

Sent = tuple[list[int], Effects]  # one msg id per message (the first copy's), what to apply


@dataclass(slots=True)
class Outgoing:
    """A message as a client sent it, before routing."""

    address: str
    body: bytes
    headers: dict[str, str]
    persistent: bool


class SendPath(Protocol):
    """Routes a batch all or nothing; the caller applies the Effects and confirms the send."""

    def send_now(self, batch: Sequence[Outgoing], now_ns: int) -> Sent | None:
        """Route now; None (nothing done) when a decision must be awaited with `send`."""
        ...

    async def send(self, batch: Sequence[Outgoing]) -> Sent:
        """Await whatever the batch needs, then route all of it."""
        ...


class LocalSendPath:
    """A standalone node's send path: the core routes every message to its local queues."""

    def __init__(self, core: BrokerCore) -> None:
        self.core = core

    def send_now(self, batch: Sequence[Outgoing], now_ns: int) -> Sent:
        return send_locally(self.core, batch, now_ns)

    async def send(self, batch: Sequence[Outgoing]) -> Sent:
        return send_locally(self.core, batch, now_ns())


def send_locally(core: BrokerCore, batch: Sequence[Outgoing], now_ns: int) -> Sent:
    """Every address checked first, so the batch is enqueued all or none."""
    if len(batch) > 1:
        for address in {m.address for m in batch}:
            core.check_address(address)
    ids: list[int] = []
    total = Effects()
    for m in batch:
        msg_id, fx = core.send(m.address, m.body, m.headers, m.persistent, now_ns)
        ids.append(msg_id)
        total.merge(fx)
    return ids, total
