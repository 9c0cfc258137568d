"""The node's HTTP endpoint on `listen.http`: probes, metrics and the console for operators.

`GET /healthz` answers 200 while the node's event loop runs (liveness: restart me if this
stops answering). `GET /readyz` answers 200 when the node can take work and 503 when it
cannot, with a JSON body that says why either way. `GET /metrics` serves a Prometheus
registry (`pinmq/metrics.py`) when handed one, and the web console's routes (`GET /` and its
JSON, `pinmq/console.py`) are served when handed. The endpoint knows nothing of the node: it
is handed a function that reports readiness, the registry and the routes, so it can sit above
any node that has them. With a TLS context it serves HTTPS only. With security, every other
path (metrics, the console) needs a user holding `manage` on every address, by HTTP basic
authentication; the probes stay open.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.registry import CollectorRegistry

from broker import credentials
from broker.authenticator import FAILED, Authenticator
from broker.config import NodeConfig
from broker.permissions import Denied
from broker.readiness import Readiness

OPEN_PATHS = frozenset(("/healthz", "/readyz"))  # probes: no credentials asked


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(
        status=status, text=json.dumps(body, sort_keys=True), content_type="application/json"
    )


class HttpServer:
    """An aiohttp server for /healthz, /readyz, with a registry /metrics, and any `routes`
    handed (the console's); `start` raises OSError if it cannot bind."""

    def __init__(
        self,
        address: str,
        node_id: str,
        readiness: Callable[[], Readiness],
        tls: ssl.SSLContext | None = None,
        authenticator: Authenticator | None = None,
        metrics: CollectorRegistry | None = None,
        routes: Iterable[web.RouteDef] = (),
    ) -> None:
        self.address = address
        self._tls = tls
        self._node_id = node_id
        self._readiness = readiness
        self._authenticator = authenticator
        app = web.Application(middlewares=[self._guard] if authenticator is not None else [])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        if metrics is not None:  # its Accept header may ask for OpenMetrics or gzip
            app.router.add_get("/metrics", make_aiohttp_handler(metrics))
        app.router.add_routes(routes)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)

    @classmethod
    def of(
        cls,
        config: NodeConfig,
        readiness: Callable[[], Readiness],
        authenticator: Authenticator | None = None,
        metrics: CollectorRegistry | None = None,
        routes: Iterable[web.RouteDef] = (),
    ) -> HttpServer:
        """The node's listen.http, over TLS when the node has `tls`."""
        tls = config.tls
        context = tls.files().server_context("none") if tls is not None else None
        return cls(
            config.listen.http, config.node.id, readiness, context, authenticator, metrics, routes
        )

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Every path but the probes: a user with `manage` on every address."""
        if request.path in OPEN_PATHS:
            return await handler(request)
        assert self._authenticator is not None
        peer = f"{request.remote}:{request.transport.get_extra_info('peername', ('', 0))[1]}"
        given = credentials.parse(request.headers.get(credentials.AUTHORIZATION))
        access = await self._authenticator.call(given, peer)
        if access is None:
            return web.Response(
                status=401,
                text=FAILED,
                headers={"WWW-Authenticate": 'Basic realm="pinmq", charset="UTF-8"'},
            )
        try:
            access.check_global("manage")
        except Denied as err:
            self._authenticator.denied(err, peer)
            return web.Response(status=403, text=str(err))
        return await handler(request)

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
