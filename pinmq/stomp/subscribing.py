"""SUBSCRIBE and UNSUBSCRIBE of a session, and the end of its subscriptions: split from
`session.py`, whose `Session` it is a part of."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from functools import partial
from typing import Any

from broker.access import Access
from broker.clock import now_ns
from broker.core import QueueExists
from broker.engine import Engine
from broker.unit import Unit
from pinmq.stomp.frames import Frame
from pinmq.stomp.protocol import (
    ACK_MODES,
    MAX_SUBSCRIPTIONS,
    ProtocolError,
    Subscription,
    prefetch_of,
    queue_name,
    required,
)


class Subscribing:
    """The subscriptions' part of `Session` (which holds every attribute used here)."""

    engine: Engine
    unit: Unit
    access: Access
    settings: Any
    version: str | None
    id: str
    out: asyncio.Queue[Any]
    esc_key: Any
    esc_value: Any
    subs: dict[str, Subscription]
    by_consumer: dict[str, Subscription]
    by_msg_id: dict[int, tuple[Subscription, int]]
    _n_subs: int
    _name: str
    _now: int

    def fail(
        self, message: str, receipt: str | None = None, headers: dict[str, str] | None = None
    ) -> None: ...

    def _subscribe(self, frame: Frame) -> Awaitable[None] | None:
        h = frame.headers
        destination = required(frame, "destination")
        queue = queue_name(destination)
        sub_id = h.get("id")
        if sub_id is None:
            if self.version != "1.0":
                raise ProtocolError("SUBSCRIBE frame requires an 'id' header")
            sub_id = destination
        if sub_id in self.subs:
            raise ProtocolError(f"subscription id {sub_id!r} is already in use")
        if len(self.subs) >= MAX_SUBSCRIPTIONS:
            raise ProtocolError(f"more than {MAX_SUBSCRIPTIONS} subscriptions on one connection")
        mode = h.get("ack", "auto")
        if mode not in ACK_MODES:
            raise ProtocolError(
                f"unknown ack mode {mode[:40]!r}: expected auto, client or client-individual"
            )
        prefetch = prefetch_of(h, self.settings.default_prefetch)
        self.access.check("consume", queue)
        if self.engine.creates(queue):
            self.access.check("create", queue)
            return self._create_and_subscribe(queue, sub_id, mode, prefetch)
        self._register(queue, sub_id, mode, prefetch)
        return None

    async def _create_and_subscribe(
        self, queue: str, sub_id: str, mode: str, prefetch: int
    ) -> None:
        with contextlib.suppress(QueueExists):  # a SEND may have created it meanwhile
            config = self.engine.config.queue_config_for(queue)
            await self.engine.create_queue(queue, queue, config, auto_created=True)
        self._now = now_ns()
        self._register(queue, sub_id, mode, prefetch)

    def _register(self, queue: str, sub_id: str, mode: str, prefetch: int) -> None:
        self._n_subs += 1
        consumer_id = f"{self.id}-{self._n_subs}"
        name = f"{self._name}/{sub_id}"
        stream = self.unit.subscribe(queue, consumer_id, name, prefetch, self.out, self._now)
        sub = Subscription.of(sub_id, mode, stream, self.version, self.esc_key, self.esc_value)
        self.subs[sub_id] = sub
        self.by_consumer[consumer_id] = sub
        stream.ended.add_done_callback(partial(self._stream_ended, sub))

    def _unsubscribe(self, frame: Frame) -> None:
        sub_id = frame.headers.get("id")
        destination = frame.headers.get("destination")
        if sub_id is None and self.version == "1.0" and destination is not None:
            # STOMP 1.0 may name the subscription by its destination instead.
            queue = queue_name(destination)
            sub_id = next((s.id for s in self.subs.values() if s.queue == queue), destination)
        if sub_id is None:
            raise ProtocolError("UNSUBSCRIBE frame requires an 'id' header")
        sub = self.subs.pop(sub_id, None)
        if sub is None:
            raise ProtocolError(f"no subscription {sub_id!r} on this connection")
        self._close_subscription(sub)
        if self.by_msg_id:
            self.by_msg_id = {k: v for k, v in self.by_msg_id.items() if v[0] is not sub}

    def _close_subscription(self, sub: Subscription) -> None:
        del self.by_consumer[sub.consumer_id]
        self.unit.unsubscribe(sub.stream)

    def _stream_ended(self, sub: Subscription, ended: asyncio.Future[tuple[str, str]]) -> None:
        """The node ended a subscription (queue deleted, node stopping): STOMP can only ERROR."""
        if sub.consumer_id in self.by_consumer and not ended.cancelled():
            _, reason = ended.result()
            self.fail(reason, headers={"subscription": sub.id})
