"""A forwarded batch is acknowledged only once it is on disk, however often the bridge sends it.

A 30-minute chaos run lost 78 messages this way: an ha pair's active process lost its node
while a batch's write was under way, so the write was refused (the node stopping) after the
receiver had counted the batch's seqs as accepted; the gate served again before the stop was
done, the bridge sent the batch again on a new stream, and the receiver acknowledged it as a
duplicate of what never reached the disk. A real engine, store and `ForwardReceiver`; the
cluster member around them is the only stand-in (`BridgeHost`: the engine, the node id).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest
from engine_queue import one_queue

from broker.config import NodeConfig
from broker.engine import Engine, NotServing
from cluster.bridge import ForwardReceiver
from pinmq_pb import cluster_pb2 as pb


@dataclass
class _Member:
    engine: Engine
    node_id: str = "node1"
    admission: None = None


async def _acknowledge(write: asyncio.Future[None]) -> None:
    await write


def _batch(*seqs: int) -> pb.ForwardBatch:
    messages = [
        pb.ForwardedMessage(seq=s, queue="q", address="q", body=b"m%d" % s, persistent=True)
        for s in seqs
    ]
    return pb.ForwardBatch(origin="node2", origin_store=7, target_node="node1", messages=messages)


async def test_a_resend_of_a_batch_whose_write_was_refused_is_never_acknowledged(
    tmp_path: Path,
) -> None:
    config = NodeConfig.model_validate({"node": {"id": "node1", "data-dir": str(tmp_path)}})
    holds = True
    engine = Engine(config, lambda: holds)
    async with one_queue(engine):
        receiver = ForwardReceiver(_Member(engine))  # type: ignore[arg-type]
        seq, write = receiver.receive(_batch(1, 2))
        assert (seq, write is not None) == (2, True)
        await write  # type: ignore[misc]
        seq, write = receiver.receive(_batch(1, 2))  # a resend of what is on disk
        assert seq == 2
        assert write is None or write.done()  # acknowledged at once

        holds = False  # the process lost its node while the next batch came
        seq, write = receiver.receive(_batch(3, 4))
        assert seq == 4 and write is not None
        with pytest.raises(NotServing):
            await write
        holds = True  # the gate serves again before the stop is done
        for resend in (_batch(3, 4), _batch(3), _batch(3, 4, 5)):
            seq, write = receiver.receive(resend)
            assert write is not None, "a seq that never reached the disk was acknowledged"
            with pytest.raises(NotServing):
                await write


async def test_a_resend_is_acknowledged_after_the_stream_that_sent_it_first_was_cancelled(
    tmp_path: Path,
) -> None:
    """A container drill stalled a group for good this way: the origin was killed while its
    last batch's write was under way here, so the gRPC stream awaiting that write was
    cancelled, and with it the write it awaited; the origin's backup took over and sent the
    batch again, and its stream, awaiting the same (cancelled) write, ended without a word:
    no ack, no status, nothing more read from it."""
    config = NodeConfig.model_validate({"node": {"id": "node1", "data-dir": str(tmp_path)}})
    engine = Engine(config, lambda: True)
    async with one_queue(engine):
        receiver = ForwardReceiver(_Member(engine))  # type: ignore[arg-type]
        seq, write = receiver.receive(_batch(1, 2))
        assert seq == 2 and write is not None and not write.done()
        first_stream = asyncio.create_task(_acknowledge(write))
        await asyncio.sleep(0)
        first_stream.cancel()  # its connection reset before the write was done
        seq, write = receiver.receive(_batch(1, 2))  # the backup's resend
        assert seq == 2 and write is not None
        await write  # done once on disk, not cancelled
        seq, write = receiver.receive(_batch(1, 2, 3))
        assert seq == 3 and write is not None
        await write
