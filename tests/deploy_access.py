"""How the tests reach the shipped cluster (deploy/node*.yaml, the containers of
docker-compose.yml): over TLS, as the user admin, with the development secrets `make secrets`
keeps in secrets/ (deploy/dev_secrets.py; `make test` makes them first, `dev_access` makes them
if they are missing). The password goes to clients in memory, to the CLI in its environment or
through --password-file: never in argv, never in an assertion message.

`ClientAccess()` (no TLS, no user) is the same for the tests' own plain loopback nodes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import REPO

from broker.client import Client, TlsFiles

SECRETS = REPO / "secrets"
USER = "admin"


@dataclass(frozen=True)
class ClientAccess:
    """A CA to trust and a user to log in as (each optional), for every kind of client."""

    ca: Path | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    password_file: Path | None = None

    @property
    def tls(self) -> TlsFiles | None:
        return TlsFiles(self.ca) if self.ca is not None else None

    def client(self, url: str, **kwargs: Any) -> Client:
        """A Python client of `url` (kwargs: audit, failover_timeout, ...)."""
        return Client(url, tls=self.tls, user=self.user, password=self.password, **kwargs)

    def stomp(self, conn: Any, hosts: list[tuple[str, int]]) -> dict[str, str]:
        """Set up a stomp.py connection of `hosts` for TLS; the connect() keyword arguments
        that log in (`conn.connect(**access.stomp(conn, hosts), wait=...)`)."""
        if self.ca is not None:
            conn.set_ssl(for_hosts=hosts, ca_certs=str(self.ca))
            conn.transport.disconnect_socket = functools.partial(drop_tls, conn.transport)
        if self.user is None or self.password is None:
            return {}
        return {"username": self.user, "passcode": self.password}

    def cli_args(self) -> list[str]:
        """`pinmq` options: --tls-ca, --user, --password-file (a path, not the password)."""
        args = ["--tls-ca", str(self.ca)] if self.ca is not None else []
        if self.user is not None and self.password_file is not None:
            args += ["--user", self.user, "--password-file", str(self.password_file)]
        return args

    def env(self) -> dict[str, str]:
        """The CLI's environment, as `source secrets/client.env` sets it."""
        env = {"PINMQ_TLS_CA": str(self.ca)} if self.ca is not None else {}
        if self.user is not None and self.password is not None:
            env |= {"PINMQ_USER": self.user, "PINMQ_PASSWORD": self.password}
        return env


@functools.cache
def dev_access() -> ClientAccess:
    """The development secrets (made now if missing: `make secrets`, which takes turns with
    other test workers) as the user admin sees them."""
    made = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "dev_secrets.py"), str(SECRETS)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    # Its output is not a tty: it names the password file, never the password.
    assert made.returncode == 0, made.stdout + made.stderr
    password_file = SECRETS / f"{USER}.password"
    password = password_file.read_text(encoding="utf-8").splitlines()[0]
    return ClientAccess(SECRETS / "ca.crt", USER, password, password_file)


def drop_tls(transport: Any) -> None:
    """stomp.py's `disconnect_socket` for a TLS connection, safe from any thread: it ends the
    receiver thread's read by shutting the TCP socket down, and that thread closes the socket.

    stomp.py's own does the TLS close (`SSLSocket.unwrap`) from the thread that disconnects,
    its heartbeat thread on a timeout, while the receiver thread may be inside SSL_read on the
    same SSL object, which OpenSSL forbids. On a frozen node the close waits for the node's
    reply, and once it thaws both threads read: a chaos run's process died of it (SIGSEGV in
    libssl, after a pair was paused), and until then the client noticed nothing."""
    transport.running = False
    sock = transport.socket
    if sock is not None:
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
