"""Who a client is: a node's password checks, off the event loop and once per connection.

An argon2id verification costs tens of milliseconds of CPU by design, so it never runs on
the event loop: one worker thread does them, in turn by client host (`LoginQueue`: a burst
from one host waits behind itself, not in front of the others, and past its bound or its
budget of failures is refused at once). A burst of wrong passwords thus costs a few checks
and then one a second, clients already connected keep being served, and a user whose
password the node verified before gets in at once: the
node keeps a keyed digest of each user's last verified password (until the users file
changes) and compares that in microseconds, as RabbitMQ's credential cache does.
A STOMP connection logs in once, at CONNECT. A gRPC client sends its credentials on every
call; the node verifies them once per connection (peer) and user. A client certificate's
subject (under `client-auth`) names a user without a password.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from collections import OrderedDict

from broker import logs
from broker.access import Access
from broker.audit import AuditLog
from broker.audit_schema import Kind
from broker.config_security import SecuritySection
from broker.credentials import Credentials
from broker.futures import taken
from broker.login_queue import LoginQueue
from broker.permissions import Authorizer, Denied
from broker.users import Principal, Users

log = logs.get("security")

MAX_CONNECTIONS = 4096  # gRPC (peer, user) pairs whose verified password is remembered
MAX_CAUSES = 1024  # distinct refusals logged once each (then forgotten, and logged again)
FAILED = "authentication failed"  # the one answer to an unknown user, a wrong or no password


class Authenticator:
    """A node's users and permissions (`security`); one per node, shared by its listeners."""

    def __init__(
        self,
        users: Users,
        authorizer: Authorizer,
        audit: AuditLog | None = None,
    ) -> None:
        self.users = users
        self.authorizer = authorizer
        self.audit = audit  # every refusal is a `denied` event
        self._logged: set[tuple[str | None, ...]] = set()  # refusals warned of already
        self._queue: LoginQueue[Principal | None] = LoginQueue()
        self._key = secrets.token_bytes(32)  # keys the digests of verified passwords
        self._verified: OrderedDict[tuple[str, str], tuple[bytes, int, Access]] = OrderedDict()
        self._known: dict[str, bytes] = {}  # user -> digest of its last verified password
        self._known_generation = -1  # of the users file the digests were verified against
        # (user, digest) -> its check under way: a burst of calls with the same credentials
        # (clients reconnecting to a node that just took over) waits for one check, instead
        # of each taking one of the host's tokens and the host's bound, and being refused.
        self._checking: dict[tuple[str, bytes], asyncio.Future[Principal | None]] = {}

    @classmethod
    def of(cls, security: SecuritySection | None, audit: AuditLog | None) -> Authenticator | None:
        """The node's authenticator; None when security is off. Raises UsersFileError."""
        if security is None or not security.enabled:
            return None
        assert security.users_file is not None  # the config requires it
        return cls(Users(security.users_file), Authorizer(security.roles), audit)

    def close(self) -> None:
        self._queue.close()

    def access(self, principal: Principal) -> Access:
        return Access(principal, self.authorizer)

    async def login(self, user: str | None, password: str | None, peer: str) -> Access | None:
        """A user's access if `password` is its password; None (logged, audited) if not."""
        digest = self._digest(password) if password is not None else None
        if user is not None and digest is not None:
            known = self._known.get(user)
            if known is not None and hmac.compare_digest(known, digest):
                principal = self.users.principal(user)
                if principal is not None:
                    return self.access(principal)
        if user is not None and digest is not None:
            checking = self._checking.get((user, digest))
            if checking is not None:  # the same password of the same user, being checked
                principal = await asyncio.shield(checking)
                return self._outcome(principal, user, peer)
        host = _host(peer)
        if self._queue.full(host):
            self._warn_once(
                ("busy", host), "password checks refused: too many waiting or failed", peer=peer
            )
            self._failed(user, peer)
            return None
        check = self._queue.run(host, lambda: self.users.authenticate(user, password))
        if user is None or digest is None:
            return self._outcome(await check, user, peer)
        checking = asyncio.ensure_future(check)
        checking.add_done_callback(taken)
        self._checking[(user, digest)] = checking
        try:
            principal = await asyncio.shield(checking)
        finally:
            del self._checking[(user, digest)]
        if principal is not None:
            self._queue.succeeded(host)
            if self._known_generation == self.users.generation():
                self._known[principal.name] = digest  # verified against the file still in force
        return self._outcome(principal, user, peer)

    def _outcome(self, principal: Principal | None, user: str | None, peer: str) -> Access | None:
        if principal is None:
            self._failed(user, peer)
            return None
        return self.access(principal)

    def _digest(self, password: str) -> bytes:
        """A keyed digest of `password`; the kept ones are dropped when the users file changes."""
        generation = self.users.generation()
        if generation != self._known_generation:
            self._known.clear()
            self._known_generation = generation
        return hmac.digest(self._key, password.encode(), hashlib.sha256)

    def certificate(self, name: str, peer: str) -> Access | None:
        """The access of the user a verified client certificate's subject names."""
        principal = self.users.principal(name)
        if principal is None:
            self._failed(name, peer)
            return None
        return self.access(principal)

    async def call(self, credentials: Credentials | None, peer: str) -> Access | None:
        """A gRPC call's access: its credentials verified once per connection and user."""
        if credentials is None:
            self._failed(None, peer)
            return None
        key = (peer, credentials.user)
        digest = self._digest(credentials.password)
        generation = self._known_generation
        known = self._verified.get(key)
        if known is not None and known[1] == generation and hmac.compare_digest(known[0], digest):
            self._verified.move_to_end(key)
            return known[2]
        access = await self.login(credentials.user, credentials.password, peer)
        if access is not None:
            self._verified[key] = (digest, generation, access)
            if len(self._verified) > MAX_CONNECTIONS:
                self._verified.popitem(last=False)
        return access

    def _failed(self, user: str | None, peer: str) -> None:
        self._warn_once(("login", user, _host(peer)), "authentication failed", user=user, peer=peer)
        if self.audit is not None:
            self.audit.record(Kind.DENIED, user=user, peer=peer)

    def denied(self, err: Denied, peer: str) -> None:
        """An operation refused for want of a permission: logged once per cause, audited."""
        self._warn_once(
            ("permission", err.user, err.permission, err.address),
            "permission denied",
            user=err.user,
            permission=err.permission,
            address=err.address,
            peer=peer,
        )
        if self.audit is not None:
            self.audit.record(
                Kind.DENIED,
                user=err.user,
                peer=peer,
                permission=err.permission,
                address=err.address,
            )

    def _warn_once(self, cause: tuple[str | None, ...], event: str, **fields: object) -> None:
        if cause in self._logged:
            return
        if len(self._logged) >= MAX_CAUSES:
            self._logged.clear()
        self._logged.add(cause)
        log.warning(event, **fields)


def _host(peer: str) -> str:
    """The host of a peer address (`host:port`, `[v6]:port`)."""
    return peer.rpartition(":")[0] or peer
