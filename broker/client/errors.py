"""The client's exceptions: what happened to a request, and one class per status worth handling.

Three outcomes never look alike:
- `Refused`: the node answered and did not do it (its reason is the message). Nothing
  happened; `NotFound`, `InvalidArgument`, `AlreadyExists` and `RefusedForNow` (no grouping
  decision in time, a store write that failed) say more.
- `ConnectionLost`: no connection, so the request was never sent. Nothing happened.
- `OutcomeUnknown`: the request was sent but no answer came (the connection broke, or the
  deadline passed). It may or may not have taken effect: a send may be enqueued, an ack
  committed. Only this outcome calls for de-duplication on retry.
`Unavailable` covers the last two and `RefusedForNow`: the cases where trying again later,
or on another node, may succeed.
"""

from __future__ import annotations

import asyncio

import grpc

from broker.channels import REFUSED_METADATA


class PinmqError(Exception):
    """Any failure reported by pinmq; `code` is the gRPC status name (e.g. "NOT_FOUND")."""

    def __init__(self, message: str, code: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.code = code


class Refused(PinmqError):
    """The node answered and refused the request; nothing was done."""


class NotFound(Refused):
    """The queue, address or group does not exist."""


class InvalidArgument(Refused):
    """The request was refused as invalid (bad settings, oversized message, ...)."""


class AlreadyExists(Refused):
    """A queue of that name exists already."""


class Full(Refused):
    """The node is full: memory (address-full-policy FAIL) or disk (limits.max-disk-usage).
    Nothing was done; the send may succeed once consumers have freed room."""


class Forbidden(Refused):
    """The client's user lacks the permission the request needs (the message names it and the
    address); nothing was done."""


class Unauthenticated(Refused):
    """The node did not accept the client's credentials (an unknown user, a wrong password, or
    none given to a node with security on); nothing was done."""


class Unavailable(PinmqError):
    """No answer from a node, or a node that cannot do it now: a retry may succeed."""


class RefusedForNow(Refused, Unavailable):
    """The node answered that it cannot do it now (no grouping decision within the handler's
    timeout, a store write that failed); nothing was done."""


class ConnectionLost(Unavailable):
    """No connection to the node: the request was not sent, nothing was done."""


class OutcomeUnknown(Unavailable):
    """The request was sent but no answer came: it may or may not have taken effect."""


class EndedUnderWrite(OutcomeUnknown):
    """A stream ended as the client wrote to it, and grpcio reported its own INTERNAL error in
    place of the status that ended it (grpc/grpc#36066): a refusal or a lost node alike."""


_BY_CODE: dict[str, type[PinmqError]] = {
    "NOT_FOUND": NotFound,
    "INVALID_ARGUMENT": InvalidArgument,
    "ALREADY_EXISTS": AlreadyExists,
    "UNAVAILABLE": RefusedForNow,
    "DEADLINE_EXCEEDED": OutcomeUnknown,
    "RESOURCE_EXHAUSTED": Full,
    "PERMISSION_DENIED": Forbidden,
    "UNAUTHENTICATED": Unauthenticated,
}


def error_for(code: str, message: str) -> PinmqError:
    """The exception for a status the node itself answered with (a refusal, in-band or not)."""
    return _BY_CODE.get(code, Refused)(message, code)


# gRPC's words when a call failed before any byte of it left: the channel could not connect.
_NOT_CONNECTED = ("failed to connect", "connection refused", "connect failed", "dns resolution")
# grpcio aio (grpc/grpc#36066): a write on a stream that had already ended (its node was killed
# under it) fails, and the call then reports this instead of the status that ended it.
_WRITE_AFTER_END = "Internal error from Core"


def from_rpc(err: grpc.RpcError, target: str) -> PinmqError:
    """What a failed call means: refused by the node, not sent, or outcome unknown."""
    code = err.code()
    name = code.name if code is not None else "UNKNOWN"
    details = err.details() or name
    if REFUSED_METADATA in tuple(err.trailing_metadata() or ()):
        return error_for(name, f"refused by {target}: {details}")
    if name == "UNAVAILABLE":
        if any(words in details.lower() for words in _NOT_CONNECTED):
            return ConnectionLost(f"no connection to {target}, nothing was sent: {details}", name)
        return OutcomeUnknown(
            f"lost the connection to {target} after sending: the outcome is unknown ({details})",
            name,
        )
    if name == "INTERNAL" and details == _WRITE_AFTER_END:
        return EndedUnderWrite(
            f"the stream to {target} ended under a write: the outcome is unknown", "UNAVAILABLE"
        )
    if name == "DEADLINE_EXCEEDED":
        return OutcomeUnknown(f"no answer from {target} in time: the outcome is unknown", name)
    if name in ("CANCELLED", "UNKNOWN", "INTERNAL"):
        return PinmqError(f"{target}: {details}", name)
    return error_for(name, f"refused by {target}: {details}")


def moved_under(what: str, target: str) -> OutcomeUnknown:
    """What grpcio's CancelledError from a call on `target` means when the task awaiting it
    was not cancelled: the client closed the call's channel as it moved to another node
    (`Client._move_on`), so whatever the call had sent has an unknown outcome. A task that
    is being cancelled gets its CancelledError again."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
    return OutcomeUnknown(f"the client moved away from {target} during the {what}", "CANCELLED")
