"""The node config's transport security and access control sections (`tls`, `security`).

Part of the YAML contract that `broker/config.py`'s `NodeConfig` holds; the files they name
are read by `broker/tls.py` (certificates) and `broker/users.py` (users).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from broker import wildcard
from broker.config_base import Strict, check_pattern
from broker.tls import TlsFiles


class TlsSection(Strict):
    """Transport security for every listener (PEM files).

    Every listener speaks TLS with `cert`/`key`; the cluster listener also requires a client
    certificate issued by `ca` (mutual TLS), and the node presents `cert` to its peers.
    `client-auth` asks clients of listen.client and listen.stomp for a certificate:
    `optional` checks one that is offered, `required` refuses a connection without one.
    """

    cert: Path
    key: Path
    ca: Path
    client_auth: Literal["none", "optional", "required"] = "none"

    def files(self) -> TlsFiles:
        """The node's certificate, key and CA, for its listeners and its own channels."""
        return _node_files(self.cert, self.key, self.ca)


@functools.cache
def _node_files(cert: Path, key: Path, ca: Path) -> TlsFiles:
    # One per node: every listener and channel shares the bytes read once.
    return TlsFiles(ca=ca, cert=cert, key=key)


Permission = Literal["send", "consume", "browse", "create", "delete", "manage"]
PERMISSIONS: tuple[Permission, ...] = ("send", "consume", "browse", "create", "delete", "manage")


def _admin_everywhere() -> dict[str, dict[Permission, list[str]]]:
    return {wildcard.ANY_WORDS: {permission: ["admin"] for permission in PERMISSIONS}}


class SecuritySection(Strict):
    """Authenticated users and Artemis-style per-address permissions.

    `roles` maps an address pattern (the address-settings wildcards; the most specific
    matching pattern wins) to the roles each permission is granted to. The users file maps a
    user name to its password hash (argon2id) and roles; nodes re-read it when it changes.
    """

    enabled: bool = False
    users_file: Path | None = None
    roles: dict[str, dict[Permission, list[str]]] = Field(default_factory=_admin_everywhere)

    @field_validator("roles")
    @classmethod
    def _patterns_well_formed(
        cls, value: dict[str, dict[Permission, list[str]]]
    ) -> dict[str, dict[Permission, list[str]]]:
        for pattern in value:
            check_pattern(pattern)
        return value

    @model_validator(mode="after")
    def _users_named(self) -> SecuritySection:
        if self.enabled and self.users_file is None:
            raise PydanticCustomError(
                "pinmq",
                "security.enabled needs security.users-file (create one with `pinmq user add`)",
            )
        return self
