"""A frame the primary gives up on (its backup was dropped while the frame was on its way) may
still end in an error inside gRPC after it was told to drop it: nobody awaits it then, and
asyncio logged "Task exception was never retrieved" (four times in a 30-minute chaos run).
`_write` takes that outcome itself."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from cluster.replication import BackupLost, _write
from pinmq_pb import cluster_pb2 as pb


class _Context:
    """A stream whose write ignores the cancel and fails later, as gRPC's did."""

    def __init__(self) -> None:
        self.failed = asyncio.Event()

    async def write(self, frame: Any) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.01)
            self.failed.set()
            raise RuntimeError("execute_batch failed") from None


async def test_a_frame_given_up_that_fails_later_logs_nothing() -> None:
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    context, gone = _Context(), loop.create_future()
    loop.call_later(0.01, gone.set_result, None)  # the backup is dropped meanwhile
    with pytest.raises(BackupLost, match="on its way"):
        await _write(context, pb.ReplicationFrame(), gone)  # type: ignore[arg-type]
    await asyncio.wait_for(context.failed.wait(), 5)
    await asyncio.sleep(0.01)
    gc.collect()
    assert unhandled == []


class _Failing:
    """A stream whose write fails once the test says so."""

    def __init__(self) -> None:
        self.fail = asyncio.get_running_loop().create_future()

    async def write(self, frame: Any) -> None:
        await self.fail
        raise RuntimeError("execute_batch failed")


async def test_a_frame_that_fails_as_its_stream_is_cancelled_logs_nothing() -> None:
    """The stream's task is cancelled (the backup went) in the same moment as its frame's
    write fails: `_write` ends with CancelledError and its write's failure is still taken."""
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    context = _Failing()
    stream = asyncio.ensure_future(_write(context, pb.ReplicationFrame(), loop.create_future()))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    context.fail.set_result(None)
    stream.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stream
    await asyncio.sleep(0.01)
    gc.collect()
    assert unhandled == []
