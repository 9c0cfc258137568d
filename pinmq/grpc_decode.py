"""gRPC requests that do not decode are refused as INVALID_ARGUMENT, never UNKNOWN.

grpcio decodes a request before the servicer sees it, and a failure there ends the call with
UNKNOWN ("Unexpected DecodeError"), as if the node had failed. Services registered through
`register` get deserializers that never raise: a request that does not decode arrives as
`Undecodable`, and the call ends with INVALID_ARGUMENT saying why: at once for a unary call,
at `refuse_undecodable` for each request a streaming call reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc import aio


class Undecodable:
    """A request whose bytes are not the message the method takes."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


async def refuse_undecodable(request: object, context: aio.ServicerContext) -> None:
    """End the call with INVALID_ARGUMENT if `request` did not decode."""
    if isinstance(request, Undecodable):
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"the request could not be decoded: {request.error}"
        )


def register(add: Callable[[Any, Any], None], servicer: object, server: aio.Server) -> None:
    """`add(servicer, server)` (a generated `add_*Servicer_to_server`), decoding leniently."""
    add(servicer, _Lenient(server))


def _lenient(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as err:
            return Undecodable(str(err))

    return decode


def _unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def call(request: Any, context: aio.ServicerContext) -> Any:
        await refuse_undecodable(request, context)
        return await behavior(request, context)

    return call


class _Lenient:
    """Stands in for the server while a generated function registers a service's methods."""

    def __init__(self, server: aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        """Ignored: `add_registered_method_handlers` gets the same methods, and adds both."""

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        lenient = {}
        for name, h in handlers.items():
            h = h._replace(request_deserializer=_lenient(h.request_deserializer))
            if h.unary_unary is not None:
                h = h._replace(unary_unary=_unary(h.unary_unary))
            lenient[name] = h
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, lenient),)
        )
        self._server.add_registered_method_handlers(service, lenient)
