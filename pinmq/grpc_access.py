"""Who calls a gRPC service of the node, and the refusals security answers with.

A call's user comes from its `authorization` metadata (broker/credentials.py), verified once
per connection by the node's `Authenticator`, or, without credentials, from the client
certificate the TLS handshake verified (`client-auth: required`). Without `security` every
call gets `OPEN`.
"""

from __future__ import annotations

from typing import NoReturn

import grpc
from grpc import aio

from broker import credentials
from broker.access import OPEN, Access
from broker.authenticator import FAILED, Authenticator
from broker.channels import peer_of
from broker.permissions import Denied
from broker.refusals import Refusals
from pinmq import grpc_status


class Gate:
    """The node's authenticator as the gRPC services use it, and the refusals they answer
    (counted by reason for metrics)."""

    def __init__(self, authenticator: Authenticator | None, refusals: Refusals) -> None:
        self.authenticator = authenticator
        self.refusals = refusals

    async def access(self, context: aio.ServicerContext) -> Access:
        """The caller's access; the call ends UNAUTHENTICATED if it has none."""
        authenticator = self.authenticator
        if authenticator is None:
            return OPEN
        peer = peer_of(context)
        given = credentials.from_metadata(context.invocation_metadata())
        subject = _subject(context)
        if given is None and subject is not None:
            access = authenticator.certificate(subject, peer)
        else:
            access = await authenticator.call(given, peer)
        if access is None:
            await self.refuse(context, grpc.StatusCode.UNAUTHENTICATED, FAILED)
        return access  # type: ignore[return-value]

    def record(self, err: Denied, context: aio.ServicerContext) -> None:
        """A refused operation, logged and audited (the caller says so to the client)."""
        if self.authenticator is not None:
            self.authenticator.denied(err, peer_of(context))

    async def deny(self, context: aio.ServicerContext, err: Denied) -> NoReturn:
        """End the call PERMISSION_DENIED, naming the permission and the address."""
        self.record(err, context)
        await self.refuse(context, grpc.StatusCode.PERMISSION_DENIED, str(err))

    async def refuse(
        self, context: aio.ServicerContext, code: grpc.StatusCode, message: str
    ) -> NoReturn:
        """End the call with the node's refusal (`pinmq/grpc_status.py`), counted."""
        self.refusals.count("grpc", code.name)
        await grpc_status.refuse(context, code, message)

    async def abort(self, context: aio.ServicerContext, err: Exception) -> NoReturn:
        """End the call with the status `err` stands for, counted if it is a refusal."""
        found = grpc_status.refusal(err)
        if found is not None:
            self.refusals.count("grpc", found[0].name)
        await grpc_status.abort(context, err)


def _subject(context: aio.ServicerContext) -> str | None:
    """The verified client certificate's common name (gRPC asks for one only when required)."""
    names = context.auth_context().get("x509_common_name") or ()
    return names[0].decode() if names else None
