"""How a client's user name and password travel: HTTP basic, in gRPC metadata or an HTTP header.

One definition for the client (which puts them on every call), the node's gRPC services and
its http listener (which read them). Over TLS only: base64 is an encoding, not a secret.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass, field

AUTHORIZATION = "authorization"  # gRPC metadata key (lower case) and HTTP header
_BASIC = "basic "


@dataclass(frozen=True, slots=True)
class Credentials:
    """A user name and its password; the password never appears in a repr or a log line."""

    user: str
    password: str = field(repr=False)

    def header(self) -> str:
        """The `authorization` value: `Basic base64(user:password)`."""
        raw = f"{self.user}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode("ascii")

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The gRPC call metadata that carries them."""
        return ((AUTHORIZATION, self.header()),)


def parse(value: str | None) -> Credentials | None:
    """The credentials of an `authorization` value, or None (absent or not basic)."""
    if value is None or value[: len(_BASIC)].lower() != _BASIC:
        return None
    try:
        raw = base64.b64decode(value[len(_BASIC) :].strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, colon, password = raw.partition(":")
    return Credentials(user, password) if colon and user else None


def from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> Credentials | None:
    """The credentials a gRPC call carries, or None."""
    for key, value in metadata or ():
        if key == AUTHORIZATION and isinstance(value, str):
            return parse(value)
    return None
