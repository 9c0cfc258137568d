"""`SyncClient`: a blocking facade for scripts, a Client on an event loop in a thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping
from types import TracebackType
from typing import Any, Self

from broker.client.base import DEFAULT_URL, Body, T
from broker.client.connection import Client
from broker.client.consumer import Received
from broker.client.producer import Producer
from broker.info import GroupInfo, QueueInfo
from broker.tls import TlsFiles


class SyncClient:
    """Blocking wrapper for scripts: a Client on an event loop in a background thread."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        tls: TlsFiles | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._client = Client(url, tls=tls, user=user, password=password)
        self._producers: dict[tuple[str, str | None, bool], Producer] = {}
        try:
            self._run(self._client.connect())
        except BaseException:
            self.close()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def send(
        self,
        address: str,
        body: Body,
        *,
        group_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        persistent: bool = True,
    ) -> int:
        """Send one message; successive sends to one group get JMSXGroupSeq 1, 2, 3..."""
        key = (address, group_id, persistent)
        producer = self._producers.get(key)
        if producer is None:
            producer = self._producers[key] = self._client.producer(
                address, group_id=group_id, persistent=persistent
            )
        return self._run(producer.send(body, headers))

    def consume(
        self, queue: str, n: int, *, timeout: float = 5.0, prefetch: int = 100
    ) -> list[Received]:
        """Receive and ack up to `n` messages; stops early after `timeout` s without one."""

        async def take() -> list[Received]:
            async with self._client.consumer(queue, prefetch=min(prefetch, n)) as consumer:
                got: list[Received] = []
                while len(got) < n and (m := await consumer.receive(timeout)) is not None:
                    got.append(m)
                if got:
                    await consumer.ack_many(got, wait=True)
                return got

        return self._run(take())

    def queues(self) -> list[QueueInfo]:
        return self._run(self._client.queues())

    def groups(self, queue: str) -> list[GroupInfo]:
        return self._run(self._client.groups(queue))

    def create_queue(self, queue: str, *, address: str | None = None, **settings: Any) -> None:
        self._run(self._client.create_queue(queue, address=address, **settings))

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self._client.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.close()
