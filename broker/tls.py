"""TLS material: what a node's listeners present and what its channels and clients trust.

One record, `TlsFiles`, for a node (its certificate, key and the CA its peers and clients are
issued by) and for a client (the CA it trusts, and a certificate when the node asks for one).
It turns them into what each transport takes: gRPC credentials, or an `ssl.SSLContext` for
STOMP and HTTP. The files are read once, when first used, so a missing or unreadable file is
one clear error at start naming it, not a failed handshake later.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import grpc

ClientAuth = Literal["none", "optional", "required"]


class TlsError(Exception):
    """A certificate, key or CA file that cannot be used; the message names it."""


# What each file must hold: the PEM block it is read for.
_BLOCKS = {"ca": b"CERTIFICATE-----", "cert": b"CERTIFICATE-----", "key": b"PRIVATE KEY-----"}
_NAMES = {"ca": "a certificate", "cert": "a certificate", "key": "a private key"}


def _read(path: Path, what: Literal["ca", "cert", "key"]) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TlsError(f"tls.{what} {path}: cannot read: {err.strerror}") from None
    if b"-----BEGIN " + _BLOCKS[what] not in data:
        raise TlsError(f"tls.{what} {path}: not {_NAMES[what]} (PEM)")
    return data


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the CA to trust, and the certificate and key to present (a client's are
    optional: only a node that asks for client certificates needs them)."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None
    _pem: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise TlsError("a certificate and its key go together: give both or neither")

    def pem(self, what: Literal["ca", "cert", "key"]) -> bytes:
        """The file's bytes, read once (TlsError if it cannot be used)."""
        if what not in self._pem:
            path = getattr(self, what)
            if path is None:
                raise TlsError(f"no tls {what} given")
            self._pem[what] = _read(path, what)
        return self._pem[what]

    def check(self) -> None:
        """Read every file now (TlsError naming the first that cannot be used)."""
        self.client_context()

    # ---- gRPC -------------------------------------------------------------------------

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """A channel that trusts `ca` and presents `cert` when it has one (mutual TLS)."""
        if self.cert is None:
            return grpc.ssl_channel_credentials(root_certificates=self.pem("ca"))
        return grpc.ssl_channel_credentials(
            root_certificates=self.pem("ca"),
            private_key=self.pem("key"),
            certificate_chain=self.pem("cert"),
        )

    def server_credentials(self, require_client_cert: bool) -> grpc.ServerCredentials:
        """A gRPC listener presenting `cert`. gRPC either requires a client certificate issued
        by `ca` or asks for none: `client-auth: optional` asks for none on gRPC."""
        return grpc.ssl_server_credentials(
            [(self.pem("key"), self.pem("cert"))],
            root_certificates=self.pem("ca"),
            require_client_auth=require_client_cert,
        )

    # ---- ssl (STOMP, HTTP) ---------------------------------------------------------------

    def server_context(self, client_auth: ClientAuth) -> ssl.SSLContext:
        """A listener presenting `cert`; `client_auth` says whether it asks for a client
        certificate issued by `ca`."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load_chain(context)
        context.load_verify_locations(cadata=self.pem("ca").decode("ascii"))
        context.verify_mode = {
            "none": ssl.CERT_NONE,
            "optional": ssl.CERT_OPTIONAL,
            "required": ssl.CERT_REQUIRED,
        }[client_auth]
        return context

    def client_context(self) -> ssl.SSLContext:
        """A connection that verifies the server against `ca` (and its name), presenting
        `cert` when there is one."""
        context = ssl.create_default_context(cadata=self.pem("ca").decode("ascii"))
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert is not None:
            self._load_chain(context)
        return context

    def _load_chain(self, context: ssl.SSLContext) -> None:
        # ssl reads a chain only from files: the paths, once their bytes proved readable.
        self.pem("cert"), self.pem("key")
        try:
            context.load_cert_chain(str(self.cert), str(self.key))
        except (ssl.SSLError, OSError) as err:
            raise TlsError(
                f"tls.cert {self.cert} and tls.key {self.key}: cannot be used together "
                f"({getattr(err, 'reason', None) or err})"
            ) from None
