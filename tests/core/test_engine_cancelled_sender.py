"""A sender that gives up while its write waits (its client went away mid-send, the ha backup
has not confirmed yet) must not take the write with it: the deliveries of that message, and
of every message after it, wait for that write. A chaos run stalled this way: when its load
stopped, the cancelled sends left a node that took acks but delivered nothing, silently.
A real engine and store; the backup's confirmation is the store's tap, held by the test."""

from __future__ import annotations

import asyncio
from pathlib import Path

from engine_queue import one_queue

from broker.clock import now_ns
from broker.config import NodeConfig
from broker.engine import Engine
from broker.message import Outgoing
from broker.sending import LocalSendPath
from broker.store_writes import StoreWrite


async def test_a_send_cancelled_while_its_write_waits_stops_no_delivery(tmp_path: Path) -> None:
    config = NodeConfig.model_validate({"node": {"id": "node1", "data-dir": str(tmp_path)}})
    engine = Engine(config)
    async with one_queue(engine) as stream:
        path = LocalSendPath()

        async def send(body: bytes) -> None:
            with engine.unit() as unit:
                path.send_now([Outgoing("q", body, {}, True)], unit, now_ns())
            assert unit.write is not None
            await unit.write

        unconfirmed: list[asyncio.Future[None]] = []

        def backup(_: StoreWrite) -> asyncio.Future[None]:
            unconfirmed.append(asyncio.get_running_loop().create_future())
            return unconfirmed[-1]

        engine.store.tap = backup
        first = asyncio.create_task(send(b"first"))
        while not unconfirmed:
            await asyncio.sleep(0.01)
        first.cancel()  # the client went away while the backup had not confirmed
        await asyncio.gather(first, return_exceptions=True)
        engine.store.tap = None
        if not unconfirmed[0].done():  # taken with the write, the backup's wait is void too
            unconfirmed[0].set_result(None)
        await send(b"second")

        bodies = []
        while len(bodies) < 2:
            batch = await asyncio.wait_for(stream.outbound.get(), 5)
            bodies += [d.message.body for d in batch]  # type: ignore[union-attr]
        assert bodies == [b"first", b"second"]
        assert not engine.failed.done()
