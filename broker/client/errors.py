"""The client's exceptions: one per gRPC status a caller may want to handle apart."""

from __future__ import annotations

import grpc


class PinmqError(Exception):
    """Any failure reported by pinmq; `code` is the gRPC status name (e.g. "NOT_FOUND")."""

    def __init__(self, message: str, code: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.code = code


class NotFound(PinmqError):
    """The queue, address or group does not exist."""


class InvalidArgument(PinmqError):
    """The request was refused as invalid (bad settings, oversized message, ...)."""


class AlreadyExists(PinmqError):
    """A queue of that name exists already."""


class Unavailable(PinmqError):
    """No node could be reached, or the connection was lost."""


_BY_CODE: dict[str, type[PinmqError]] = {
    "NOT_FOUND": NotFound,
    "INVALID_ARGUMENT": InvalidArgument,
    "ALREADY_EXISTS": AlreadyExists,
    "UNAVAILABLE": Unavailable,
}


def error_for(code: str, message: str) -> PinmqError:
    return _BY_CODE.get(code, PinmqError)(message, code)


REFUSED_METADATA = ("pinmq-refused", "1")  # the node answered: its refusal, not a lost link


def from_rpc(err: grpc.RpcError, target: str) -> PinmqError:
    code = err.code()
    name = code.name if code is not None else "UNKNOWN"
    details = err.details() or name
    if name == "UNAVAILABLE" and REFUSED_METADATA not in tuple(err.trailing_metadata() or ()):
        details = f"lost or no connection to {target}: {details}"
    return error_for(name, details)
