"""Consumer streams and the order deliveries leave in: the engine's output side.

Every subscribed consumer has a `ConsumerStream`, which its shell (gRPC, STOMP, the cluster's
bridge) drains. `Outlets` holds them and pushes what the core decided: deliveries reach the
streams strictly in the order the core produced them, and never before the store writes they
depend on are done (the write that adds a delivered message, the one that counts its
delivery, the one that settles what a receipt confirms). Steps whose writes are done go out at
once; the rest wait, in order, in a backlog drained by one task.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from broker.effects import Delivery

Write = asyncio.Future[None]


@dataclass(slots=True)
class Receipt:
    """Settled delivery ids, to be confirmed to the consumer once their outcome is stored."""

    delivery_ids: list[int]


@dataclass(slots=True, eq=False)
class ConsumerStream:
    """One subscribed consumer as the shells see it: its outbound queue and its end.

    `outbound` holds lists of deliveries and receipts in the order they must be sent; the
    transport drains it. `ended` completes (with a status code name and a reason) when the
    node ends the subscription, e.g. because its queue was deleted. `first_key`: the queue's
    group-first-key header, set on the first message of a group a consumer gets.
    """

    consumer_id: str
    queue: str
    first_key: str | None = None
    outbound: asyncio.Queue[list[Delivery] | Receipt] = field(default_factory=asyncio.Queue)
    ended: asyncio.Future[tuple[str, str]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    owed: int = 0  # receipts for settles already applied, not yet in `outbound`
    writing: bool = False  # the transport took items from `outbound` and is sending them

    def end(self, code: str, reason: str) -> None:
        if not self.ended.done():
            self.ended.set_result((code, reason))


ReceiptFor = tuple[ConsumerStream, Receipt]


@dataclass(slots=True)
class _Step:
    """Deliveries (and receipts) waiting for store writes before they may go out."""

    gates: list[Write]
    deliveries: list[Delivery]
    receipts: list[ReceiptFor]


class Outlets:
    """The node's consumer streams, and the one ordered path deliveries take to them."""

    def __init__(self, may_push: Callable[[], bool]) -> None:
        self._streams: dict[str, ConsumerStream] = {}
        self._may_push = may_push  # False: the node lost its right to serve, nothing goes out
        self._backlog: deque[_Step] = deque()
        self._ready = asyncio.Event()

    def __contains__(self, consumer_id: str) -> bool:
        return consumer_id in self._streams

    def add(self, stream: ConsumerStream) -> None:
        self._streams[stream.consumer_id] = stream

    def remove(self, consumer_id: str) -> None:
        self._streams.pop(consumer_id, None)

    def end(
        self,
        code: str,
        reason: str,
        queue: str | None = None,
        consumers: Collection[str] | None = None,
    ) -> None:
        """End every stream (of one queue, or of these consumers): their shells close the
        subscriptions."""
        if consumers is not None:
            for consumer_id in consumers:
                stream = self._streams.get(consumer_id)
                if stream is not None:
                    stream.end(code, reason)
            return
        for stream in list(self._streams.values()):
            if queue is None or stream.queue == queue:
                stream.end(code, reason)

    def push(
        self, deliveries: list[Delivery], receipts: list[ReceiptFor], gates: Iterable[Write | None]
    ) -> None:
        """Send now if nothing is owed before (no unfinished gate, no backlog), else queue."""
        for stream, _ in receipts:
            stream.owed += 1
        waiting = [g for g in gates if g is not None and not g.done()]
        if not waiting and not self._backlog:
            self._send(deliveries, receipts)
        else:
            self._backlog.append(_Step(waiting, deliveries, receipts))
            self._ready.set()

    async def run(self) -> None:
        """Drain the backlog in order; ends when a gate fails (the node fails with it)."""
        backlog = self._backlog
        while True:
            await self._ready.wait()
            self._ready.clear()
            while backlog:
                step = backlog[0]
                for gate in step.gates:
                    try:
                        await gate
                    except Exception:
                        return  # the node fails: nothing more goes out
                backlog.popleft()
                self._send(step.deliveries, step.receipts)

    def _send(self, deliveries: list[Delivery], receipts: list[ReceiptFor]) -> None:
        if not self._may_push():
            return  # decided while the node was held, not sent before it was lost
        streams = self._streams
        if deliveries:
            first = deliveries[0].consumer_id
            if all(d.consumer_id == first for d in deliveries):
                if (stream := streams.get(first)) is not None:
                    stream.outbound.put_nowait(deliveries)
            else:
                per: dict[str, list[Delivery]] = {}
                for d in deliveries:
                    per.setdefault(d.consumer_id, []).append(d)
                for consumer_id, batch in per.items():
                    if (stream := streams.get(consumer_id)) is not None:
                        stream.outbound.put_nowait(batch)
        # A consumer that is gone had its deliveries returned to the queue by close_consumer.
        for stream, receipt in receipts:
            stream.owed -= 1
            if stream.consumer_id in streams:
                stream.outbound.put_nowait(receipt)
