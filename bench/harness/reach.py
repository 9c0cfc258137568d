"""How a benchmark's clients reach a node: TLS and a user's login, or (the default) neither."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.client import Client
from broker.credentials import Credentials
from broker.tls import TlsFiles


@dataclass(frozen=True, slots=True)
class Reach:
    """TLS to the node when `tls` (the CA to trust); a login as `user` when given one.

    Picklable: spawned client processes get it with their node's address.
    """

    tls: TlsFiles | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    def client(self, url: str) -> Client:
        """A `Client` of `url` (not yet connected) that speaks TLS and logs in as asked."""
        return Client(url, tls=self.tls, user=self.user, password=self.password)

    def login(self) -> tuple[str, str] | None:
        """(user, password), or None without a user."""
        return None if self.user is None or self.password is None else (self.user, self.password)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The gRPC call metadata that carries the login (none without a user)."""
        login = self.login()
        return () if login is None else Credentials(*login).metadata()

    async def log_in(self, client: Client) -> None:
        """With a user, a first call on the connected `client`: the node checks the password
        (argon2id, costly by design) now, as connection set-up, not in a timed region."""
        if self.user is not None:
            await client.queues()


PLAIN = Reach()  # plain text, no login: every benchmark's nodes unless told otherwise
