"""A node's engine as it stops: what arrives after `close` began is no fault of the node.

A consumer stream's clean-up can run after the engine closed its store (grpc.aio cancels a
handler in `server.stop` and its `finally` runs on a later turn of the loop); the write it
makes (the delivery going back, its count) is refused by the closed store. That must not turn
a clean SIGTERM into "fatal error, stopping" and exit code 1. A real engine and store.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from structlog.testing import capture_logs

from broker.clock import now_ns
from broker.config import NodeConfig, QueueConfig
from broker.engine import Engine
from broker.message import GROUP_ID_HEADER, Outgoing
from broker.sending import LocalSendPath
from broker.store import StoreClosed


async def _engine_with_a_delivery(tmp_path: Path) -> tuple[Engine, object]:
    config = NodeConfig.model_validate({"node": {"id": "n1", "data-dir": str(tmp_path)}})
    engine = Engine(config, lambda: True)
    engine.open()
    engine.start()
    await engine.create_queue("q", "q", QueueConfig())
    with engine.unit() as unit:
        stream = unit.subscribe("q", "c1", "worker", 10)
    with engine.unit() as unit:
        message = Outgoing("q", b"m", {GROUP_ID_HEADER: "g"}, True)
        LocalSendPath().send_now([message], unit, now_ns())
    assert unit.write is not None
    await unit.write
    await asyncio.wait_for(stream.outbound.get(), 5)  # out to the consumer, unacked
    return engine, stream


async def test_a_stream_ended_after_the_engine_closed_is_not_a_fatal_error(
    tmp_path: Path,
) -> None:
    engine, stream = await _engine_with_a_delivery(tmp_path)
    await engine.close()
    with capture_logs() as logged:
        for _ in range(2):
            with engine.unit() as unit:
                unit.unsubscribe(stream)  # type: ignore[arg-type]
            await asyncio.sleep(0.05)  # the refused write's callback has run
    assert not engine.failed.done()
    assert [e["log_level"] for e in logged] == ["info"]  # once, and no error
    assert "after the store closed" in logged[0]["event"]


async def test_a_closed_store_before_close_is_still_fatal(tmp_path: Path) -> None:
    engine, _ = await _engine_with_a_delivery(tmp_path)
    try:
        engine.fail(StoreClosed("store is closed"))  # not stopping: a bug, the node stops
        assert isinstance(engine.failed.result(), StoreClosed)
    finally:
        await engine.close()
