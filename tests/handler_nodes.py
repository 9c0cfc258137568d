"""Grouping handlers for tests: a LOCAL handler served on an in-process `grpc.aio` server (as
the cluster's server hosts it on a node, with an interceptor counting the calls that reach
it), REMOTE handlers pointed at it, and bounded waits.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from grpc import aio

from broker.config import GroupingHandlerSection
from handler.local import LocalHandler
from handler.remote import RemoteHandler
from handler.service import GroupingServicer

WAIT_S = 10.0


def section(kind: str = "LOCAL", **settings: Any) -> GroupingHandlerSection:
    return GroupingHandlerSection(type=kind, **settings)


class CallCounter(aio.ServerInterceptor):
    """Counts the RPCs that reach the server, by method name."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        self.calls[details.method.rsplit("/", 1)[-1]] += 1
        return await continuation(details)


class LocalNode:
    """A LocalHandler served on a loopback port; the server can be stopped and restarted."""

    def __init__(self, handler: LocalHandler) -> None:
        self.handler = handler
        self.servicer = GroupingServicer(handler)
        self.counter = CallCounter()
        self.port = 0
        self.server: aio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def serve(self) -> None:
        self.server = aio.server(interceptors=[self.counter])
        self.servicer.add_to_server(self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        await self.server.start()

    async def halt(self) -> None:
        if self.server is not None:
            await self.server.stop(None)
            self.server = None

    @property
    def proposals(self) -> int:
        """Proposals that reached this service, by Propose or ProposeStream."""
        return self.servicer.proposals

    def last_use(self, group: str, queue: str) -> int | None:
        for b, last_use in self.handler.arbiter.bindings():
            if b.key == (group, queue):
                return last_use
        return None


@asynccontextmanager
async def local_node(data_dir: Path, epoch: int = 1, **settings: Any) -> AsyncIterator[LocalNode]:
    handler = LocalHandler(section("LOCAL", **settings), "n-local", data_dir, epoch=epoch)
    await handler.start()
    node = LocalNode(handler)
    await node.serve()
    try:
        yield node
    finally:
        await node.halt()
        await handler.stop()


@asynccontextmanager
async def remote_handler(
    locate: Callable[[], str | None], node_id: str = "n-remote", **settings: Any
) -> AsyncIterator[RemoteHandler]:
    remote = RemoteHandler(locate, section("REMOTE", **settings), node_id, reconnect_interval_ms=50)
    await remote.start()
    try:
        yield remote
    finally:
        await remote.stop()


def stored_rows(path: Path) -> list[tuple[str, str, str, int]]:
    conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    try:
        return conn.execute("SELECT grp, queue, node, epoch FROM bindings ORDER BY grp").fetchall()
    finally:
        conn.close()
