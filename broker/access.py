"""What one client connection may do: its authenticated user and the node's permissions.

A protocol shell gets an `Access` when the connection authenticates (or `OPEN` when the node
has no `security`) and asks it before every command that needs a permission. The answer for
a (permission, address) pair is remembered for the connection, so a check on the message
path is one dictionary look-up after the first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from broker.config_security import Permission
from broker.permissions import Authorizer, Denied
from broker.users import Principal

MAX_REMEMBERED = 4096  # (permission, address) answers one connection keeps


class Access:
    """A connection's user (None: security off, everything allowed) and its answers."""

    def __init__(self, principal: Principal | None, authorizer: Authorizer | None) -> None:
        self.principal = principal
        self._authorizer = authorizer
        self._answers: dict[tuple[Permission, str], bool] = {}

    @property
    def user(self) -> str | None:
        """The authenticated user's name (None without security)."""
        return None if self.principal is None else self.principal.name

    def allows(self, permission: Permission, address: str) -> bool:
        if self.principal is None or self._authorizer is None:
            return True
        key = (permission, address)
        answer = self._answers.get(key)
        if answer is None:
            answer = self._authorizer.allows(self.principal, permission, address)
            if len(self._answers) >= MAX_REMEMBERED:
                self._answers.clear()
            self._answers[key] = answer
        return answer

    def check(self, permission: Permission, address: str) -> None:
        """Raise `Denied` unless the user holds `permission` on `address`."""
        if not self.allows(permission, address):
            assert self.principal is not None
            raise Denied(self.principal.name, permission, address)

    def check_global(self, permission: Permission) -> None:
        """Raise `Denied` unless the user holds `permission` on every address (pattern #)."""
        if self.principal is not None and self._authorizer is not None:
            self._authorizer.check_global(self.principal, permission)

    def check_send(self, addresses: Iterable[str], creates: Callable[[str], bool]) -> None:
        """`send` on each address, and `create` on those a send would auto-create."""
        if self.principal is None:
            return
        for address in addresses:
            self.check("send", address)
            if creates(address):
                self.check("create", address)


OPEN = Access(None, None)  # a node without security: every connection may do everything
