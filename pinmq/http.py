"""The node's HTTP endpoint on `listen.http`: liveness and readiness for probes and operators.

`GET /healthz` answers 200 while the node's event loop runs (liveness: restart me if this
stops answering). `GET /readyz` answers 200 when the node can take work and 503 when it
cannot, with a JSON body that says why either way. The endpoint knows nothing of the node:
it is handed a function that reports readiness, so it can sit above any node that has one.
With a TLS context it serves HTTPS only.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable
from typing import Any

from aiohttp import web

from broker.config import NodeConfig
from broker.readiness import Readiness


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(
        status=status, text=json.dumps(body, sort_keys=True), content_type="application/json"
    )


class HttpServer:
    """An aiohttp server for /healthz and /readyz; `start` raises OSError if it cannot bind."""

    def __init__(
        self,
        address: str,
        node_id: str,
        readiness: Callable[[], Readiness],
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.address = address
        self._tls = tls
        self._node_id = node_id
        self._readiness = readiness
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)

    @classmethod
    def of(cls, config: NodeConfig, readiness: Callable[[], Readiness]) -> HttpServer:
        """The node's listen.http, over TLS when the node has `tls`."""
        tls = config.tls
        context = tls.files().server_context("none") if tls is not None else None
        return cls(config.listen.http, config.node.id, readiness, context)

    async def start(self) -> None:
        host, _, port = self.address.rpartition(":")
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, host.strip("[]"), int(port), reuse_port=False, ssl_context=self._tls
        )
        try:
            await site.start()
        except OSError as err:
            await self._runner.cleanup()
            raise OSError(
                f"cannot listen on {self.address} (listen.http in use or not a local address: "
                f"{err.strerror})"
            ) from None

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _healthz(self, _request: web.Request) -> web.Response:
        return _json(200, {"node": self._node_id, "alive": True})

    async def _readyz(self, _request: web.Request) -> web.Response:
        state = self._readiness()
        return _json(200 if state.ready else 503, {**state.details, "ready": state.ready})
