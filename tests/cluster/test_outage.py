"""Outage: a link retried every reconnect-interval logs each failure of an outage once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc import aio

from cluster.outage import Outage, raise_if_cancelled
from cluster.replica import Follower


def test_alternating_failures_are_each_news_once_per_outage() -> None:
    outage = Outage()
    passive, core = "UNAVAILABLE: node1-backup is passive", "INTERNAL: Internal error from Core"
    assert [outage.news(r) for r in (passive, core, passive, core, passive)] == [
        True,
        True,
        False,
        False,
        False,
    ]
    outage.over()  # the link was up in between: the same failures are news again
    assert outage.news(core) and outage.news(passive)
    assert not outage.news(core)


# ---- a retry loop that its own cancellation reaches as a failure -----------------------------


def _as_grpc_reports_it() -> aio.AioRpcError:
    return aio.AioRpcError(
        grpc.StatusCode.INTERNAL, aio.Metadata(), aio.Metadata(), "Internal error from Core"
    )


async def test_a_follower_stopped_while_grpc_reports_the_stop_as_a_failure_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backup's process is elected and stops following its old primary: it must not wait
    for ever for a follower that took its cancellation for a broken stream (seen under load:
    the elected process never started its node)."""
    follower = Follower("node1-backup", "127.0.0.1:1", tmp_path, 0.01, warn_after_s=60)
    following = asyncio.Event()
    disguised: list[bool] = []

    async def follow() -> None:
        following.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            if disguised:  # once, as grpcio did: a loop that went on can still be cleaned up
                raise
            disguised.append(True)
            raise _as_grpc_reports_it() from None

    monkeypatch.setattr(follower, "_follow", follow)
    task = asyncio.create_task(follower.run())
    await following.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(10):  # a bound, so that the bug fails rather than hangs
            await task
    await follower.close()


async def test_the_guard_leaves_a_loop_that_was_not_cancelled_alone() -> None:
    async def one_failure() -> str:
        try:
            raise _as_grpc_reports_it()
        except aio.AioRpcError:
            raise_if_cancelled()
            return "retried"

    assert await asyncio.create_task(one_failure()) == "retried"
