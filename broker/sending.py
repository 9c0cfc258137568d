"""The seam between the protocol shells and the send path: one interface, two implementations.

A shell (gRPC, STOMP) turns what a client sent into `Outgoing` messages and hands a batch to
the node's `SendPath`; it never knows whether the node is clustered. `LocalSendPath` is a
standalone node's: every message goes through `BrokerCore.send`. The clustered one
(`cluster/sending.py`) routes to queue instances across the cluster and may have to await a
grouping decision first, which is why `send_now` may answer None.

Both route a client's batch through `route_once`, the one place where a node accepts what a
client sent it: messages carrying an `_AMQ_DUPL_ID` the address accepted lately are dropped
there and answered as sent. Messages another node forwards never come this way: the node a
client sent to decided already, and forwarding has its own exactly-once marks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
        core = self.core
        sent = route_once(core, batch, lambda fresh: send_locally(core, fresh, now_ns))
        assert sent is not None
        return sent

    async def send(self, batch: Sequence[Outgoing]) -> Sent:
        return self.send_now(batch, now_ns())


def route_once(
    core: BrokerCore,
    batch: Sequence[Outgoing],
    route: Callable[[Sequence[Outgoing]], Sent | None],
) -> Sent | None:
    """Route what of a client's batch is no duplicate (`BrokerCore.duplicates`) with `route`,
    then remember its ids in the same Effects, so they are stored with the messages.

    A dropped duplicate gets the msg id of the message first accepted with its id (0 once the
    cache no longer holds it) and is reported in the Effects. Returns None, having changed
    nothing, when `route` does (a grouping decision to await); the batch is then screened
    again when routed, since another may have brought the same id meanwhile. Nothing is
    remembered of a batch that `route` refuses.
    """
    dropped = core.duplicates(batch)
    fresh = [m for m, drop in zip(batch, dropped, strict=True) if not drop]
    sent = route(fresh) if fresh else ([], Effects())
    if sent is None:
        return None
    ids, fx = sent
    for m, msg_id in zip(fresh, ids, strict=True):
        core.accepted(m, msg_id, fx)
    if len(fresh) == len(batch):
        return ids, fx
    routed = iter(ids)
    answers = [
        core.dropped(m, fx) if drop else next(routed)
        for m, drop in zip(batch, dropped, strict=True)
    ]
    return answers, fx


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
