"""A backup process while passive (`ha.role: backup`): it follows its primary's stores.

It serves no clients: the client and STOMP listeners stay closed, so a client given both
addresses goes to the primary. Its HTTP endpoint answers `/healthz`, and `/readyz` says "not
ready" with what it follows and how far it got (cluster/replica.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from broker import logs
from broker.config import NodeConfig
from broker.readiness import Readiness
from cluster.replica import Follower
from pinmq.http import HttpServer

log = logs.get("standby")


class Standby:
    """The passive backup: a `Follower` and the HTTP endpoint, with `Node`'s lifecycle."""

    def __init__(self, config: NodeConfig) -> None:
        assert config.ha is not None and config.ha.primary is not None
        assert config.cluster is not None
        self.config = config
        self.follower = Follower(
            config.node.id,
            config.ha.primary,
            Path(config.node.data_dir),
            retry_s=config.cluster.reconnect_interval / 1000,
        )
        self.failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        self._http = HttpServer(config.listen.http, config.node.id, self.readiness)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        Path(self.config.node.data_dir).mkdir(parents=True, exist_ok=True)
        await self._http.start()
        self._task = asyncio.create_task(self.follower.run(), name="follow-primary")
        self._task.add_done_callback(self._ended)
        log.info("backup started: following the primary", primary=self.follower.primary)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and not self.failed.done():
            self.failed.set_result(task.exception())  # type: ignore[arg-type]

    async def stop(self, grace_s: float = 5.0) -> None:
        del grace_s  # nothing in flight to wait for
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.follower.close()
        await self._http.stop()
        log.info("backup stopped")

    def readiness(self) -> Readiness:
        status = self.follower.status()
        details = {
            "node": self.config.node.id,
            "role": "backup",
            "serving": False,
            "ha": {"role": "backup", **status},
            "reasons": [f"passive backup of {status['primary']}: serves no clients"],
        }
        return Readiness(False, details)
