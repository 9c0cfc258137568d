"""How the gRPC services end a call the node refuses, shared by the Broker and Admin services.

A refusal carries trailing metadata (`broker/channels.py`'s REFUSED_METADATA) so a client can
tell it, even an UNAVAILABLE one (no grouping decision, a failed store write), from a lost
connection; a pair process that stopped holding its node answers UNAVAILABLE without it, so a
client with the pair's other address goes there.
"""

from __future__ import annotations

from typing import NoReturn

import grpc
from grpc import aio

from broker.channels import REFUSED_METADATA
from broker.core import CoreError
from broker.engine import NotServing
from broker.store import StoreError


class Refused(Exception):
    """A request refused before it reached the engine (a malformed or oversized request)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def status_of(err: CoreError) -> grpc.StatusCode:
    return grpc.StatusCode[err.code.upper()]


async def refuse(context: aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    """End the call with the node's refusal."""
    await context.abort(code, message, trailing_metadata=(REFUSED_METADATA,))


def refusal(err: Exception) -> tuple[grpc.StatusCode, str] | None:
    """The status and message a refusal for `err` carries; None: `err` is no refusal."""
    if isinstance(err, Refused):
        return err.code, str(err)
    if isinstance(err, CoreError):
        return status_of(err), str(err)
    if isinstance(err, StoreError):
        return grpc.StatusCode.UNAVAILABLE, f"store write failed: {err}"
    if isinstance(err, MemoryError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, "the node is out of memory"
    return None


async def abort(context: aio.ServicerContext, err: Exception) -> NoReturn:
    """End the call with the status that `err` stands for; unexpected errors propagate."""
    found = refusal(err)
    if found is not None:
        await refuse(context, *found)
    if isinstance(err, NotServing):
        await gone(context, err)
    raise err


async def gone(context: aio.ServicerContext, err: NotServing) -> NoReturn:
    """An ha pair process that stopped holding its node: not a refusal (no metadata)."""
    await context.abort(grpc.StatusCode.UNAVAILABLE, f"{err}: its pair's other process serves")
