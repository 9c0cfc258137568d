"""listen.cluster admits nodes only: a client certificate of the same CA is not enough.

Mutual TLS proves that a peer's certificate comes from `tls.ca`, but under `client-auth` the
same CA issues the clients' certificates too, and a client must not gossip, forward, propose,
unbind, vote or replicate. A node's certificate is one a server may present: its extended key
usage names serverAuth (as `pinmq certs` issues them; its client certificates name clientAuth
only). Every call on the cluster listener is checked (the answer is kept per certificate);
any other is ended PERMISSION_DENIED and logged once per peer host.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from grpc import aio

from broker import logs
from broker.channels import Options, peer_of
from broker.tls import TlsFiles

log = logs.get("cluster")

MAX_REMEMBERED = 256  # certificates whose answer is kept; hosts warned of
REFUSAL = "listen.cluster admits node certificates only (extended key usage serverAuth)"


def is_node_certificate(pem: bytes) -> bool:
    """Whether a PEM certificate's extended key usage names serverAuth."""
    try:
        usage = x509.load_pem_x509_certificate(pem).extensions.get_extension_for_class(
            x509.ExtendedKeyUsage
        )
    except (ValueError, x509.ExtensionNotFound):
        return False
    return ExtendedKeyUsageOID.SERVER_AUTH in usage.value


class NodeCertificates(aio.ServerInterceptor):
    """Ends every call on listen.cluster whose peer presented no node certificate."""

    def __init__(self) -> None:
        self._answers: dict[bytes, bool] = {}
        self._warned: set[str] = set()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        kind = next(k for k in _KINDS if getattr(handler, k) is not None)
        return handler._replace(**{kind: self._guard(getattr(handler, kind))})  # type: ignore[attr-defined]

    def _guard(self, behaviour: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(behaviour):

            async def streamed(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
                await self._admit(context)
                async for response in behaviour(request, context):
                    yield response

            return streamed

        async def answered(request: Any, context: aio.ServicerContext) -> Any:
            await self._admit(context)
            return await behaviour(request, context)

        return answered

    async def _admit(self, context: aio.ServicerContext) -> None:
        [pem] = context.auth_context().get("x509_pem_cert") or [b""]
        admitted = self._answers.get(pem)
        if admitted is None:
            admitted = is_node_certificate(pem)
            if len(self._answers) >= MAX_REMEMBERED:
                self._answers.clear()
            self._answers[pem] = admitted
        if admitted:
            return
        peer = peer_of(context)
        host = peer.rpartition(":")[0]
        if host not in self._warned:
            if len(self._warned) >= MAX_REMEMBERED:
                self._warned.clear()
            self._warned.add(host)
            log.warning("a certificate that is not a node's refused on listen.cluster", peer=peer)
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, REFUSAL)


_KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


def cluster_server(tls: TlsFiles | None, options: Options | None = None) -> aio.Server:
    """A server for listen.cluster: with `tls`, its calls admit node certificates only."""
    return aio.server(options=options, interceptors=[NodeCertificates()] if tls else None)
