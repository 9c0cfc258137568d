"""An ha pair's active process that lost its quorum (it was frozen past failure-timeout, and
the other process may serve by now) must carry out and record nothing more: not a delivery
already decided, not a write, not an audit event, even if it holds its node again before
its stop is done. A real engine, store and audit log; the
failover shell is the `serving` callable it is given (what `Node` wires to `may_serve`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from engine_queue import one_queue
from structlog.testing import capture_logs

from broker.audit import read_events, segments
from broker.clock import now_ns
from broker.config import NodeConfig
from broker.engine import Engine, NotServing
from broker.message import DUPLICATE_ID_HEADER, Outgoing
from broker.sending import LocalSendPath


async def test_a_process_that_lost_its_node_carries_out_and_records_nothing_more(
    tmp_path: Path,
) -> None:
    config = NodeConfig.model_validate(
        {
            "node": {"id": "node1", "data-dir": str(tmp_path / "data")},
            "audit": {"enabled": True, "dir": str(tmp_path / "audit"), "flush-ms": 10},
        }
    )
    holds = True
    engine = Engine(config, lambda: holds)
    assert engine.audit is not None
    try:
        async with one_queue(engine) as stream:
            path = LocalSendPath()

            async def send(body: str) -> None:
                headers = {DUPLICATE_ID_HEADER: body}  # a client's retry carries the same id
                with engine.unit() as unit:
                    path.send_now([Outgoing("q", body.encode(), headers, True)], unit, now_ns())
                assert unit.write is not None
                await unit.write

            await send("before")
            [delivery] = await asyncio.wait_for(stream.outbound.get(), 5)
            assert delivery.message.body == b"before"  # type: ignore[union-attr]

            holds = False  # its promises expired while it was frozen
            with capture_logs() as logged, pytest.raises(NotServing, match="no longer held"):
                await send("after")
            # The pair's shell warns of the fence; the engine's stop adds no error of its own.
            assert [e["log_level"] for e in logged if e["log_level"] != "debug"] == ["info"]
            assert isinstance(engine.failed.result(), NotServing)  # the node stops
            # The refused send is in the core (its id too), never on disk: if the gate serves
            # again before the stop is done, a client's retry must not be confirmed as its
            # duplicate, nor anything else be carried out.
            holds = True
            with pytest.raises(NotServing, match="node1 is stopping"):
                await send("after")
            with pytest.raises(NotServing, match="node1 is stopping"):
                await send("later")
            engine.audit.record("unbound", group="g")  # nor does anything else get recorded
            await asyncio.sleep(0.05)
            assert stream.outbound.empty()
    finally:
        engine.close_audit()
    events = [e for path in segments(tmp_path / "audit") for e in read_events(path)]
    assert [(e["kind"], e.get("msg_id")) for e in events] == [("sent", 1), ("delivered", 1)]
