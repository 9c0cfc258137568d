"""A real engine on its data directory with one queue, `q`, and one consumer on it: the
setting of the tests of the engine itself (tests/core/test_engine_*.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from broker.config import QueueConfig
from broker.engine import Engine
from broker.streams import ConsumerStream


@asynccontextmanager
async def one_queue(engine: Engine) -> AsyncIterator[ConsumerStream]:
    """`engine` opened and started, queue `q` created and consumer `c1` subscribed to it (its
    stream, prefetch 10); the engine closed after."""
    engine.open()
    engine.start()
    try:
        await engine.create_queue("q", "q", QueueConfig())
        with engine.unit() as unit:
            stream = unit.subscribe("q", "c1", "worker", 10)
        yield stream
    finally:
        await engine.close()
