"""Who may do what on which address: Artemis-style security settings, pure (no I/O).

`security.roles` maps an address pattern (the address-settings wildcards of
`broker/wildcard.py`) to the roles each permission is granted to. For one address, the most
specific matching pattern decides alone: a permission it does not list is granted to nobody,
whatever less specific patterns say (no merging), and an address no pattern matches is open
to nobody.

Operations that name no address (cluster status, resetting the groups of every queue) need
the permission on every address, that is under the catch-all pattern `#` itself; without a
`#` entry nobody holds them (`allows_global`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache

from broker import wildcard
from broker.config_security import PERMISSIONS, Permission
from broker.users import Principal

CACHE_SIZE = 65_536  # (permission, address) pairs whose granted roles are remembered
_NOBODY: frozenset[str] = frozenset()


class Denied(Exception):
    """A principal lacks a permission on an address (None: an operation on every address)."""

    def __init__(self, user: str, permission: Permission, address: str | None) -> None:
        where = "every address (pattern '#')" if address is None else f"address {address!r}"
        super().__init__(f"user {user!r} lacks permission {permission!r} on {where}")
        self.user = user
        self.permission = permission
        self.address = address


class Authorizer:
    """Checks permissions against a roles table (`SecuritySection.roles`).

    The roles granted per (permission, address) are computed once and kept in a bounded
    LRU cache, so a check is a dictionary look-up and a set intersection.
    """

    def __init__(
        self,
        roles: Mapping[str, Mapping[Permission, Sequence[str]]],
        cache_size: int = CACHE_SIZE,
    ) -> None:
        table: dict[str, dict[Permission, frozenset[str]]] = {}
        for pattern, grants in roles.items():
            unknown = sorted(set(grants) - set(PERMISSIONS))
            if unknown:
                raise ValueError(f"pattern {pattern!r}: unknown permission {unknown[0]!r}")
            table[pattern] = {perm: frozenset(names) for perm, names in grants.items()}
        self._table = table
        self._patterns = tuple(table)
        self._cached = lru_cache(maxsize=cache_size)(self._compute)

    def granted(self, permission: Permission, address: str) -> frozenset[str]:
        """The roles granted `permission` on `address` (empty: nobody)."""
        return self._cached(permission, address)

    def allows(self, principal: Principal, permission: Permission, address: str) -> bool:
        """Whether one of the principal's roles is granted `permission` on `address`."""
        return not self._cached(permission, address).isdisjoint(principal.roles)

    def check(self, principal: Principal, permission: Permission, address: str) -> None:
        """Raise `Denied` unless `allows(principal, permission, address)`."""
        if not self.allows(principal, permission, address):
            raise Denied(principal.name, permission, address)

    def granted_global(self, permission: Permission) -> frozenset[str]:
        """The roles granted `permission` under the pattern `#` itself (empty: nobody)."""
        return self._table.get(wildcard.ANY_WORDS, {}).get(permission, _NOBODY)

    def allows_global(self, principal: Principal, permission: Permission) -> bool:
        """Whether the principal may do an operation that names no address (see module doc)."""
        return not self.granted_global(permission).isdisjoint(principal.roles)

    def check_global(self, principal: Principal, permission: Permission) -> None:
        """Raise `Denied` (address None) unless `allows_global(principal, permission)`."""
        if not self.allows_global(principal, permission):
            raise Denied(principal.name, permission, None)

    def _compute(self, permission: Permission, address: str) -> frozenset[str]:
        pattern = wildcard.most_specific(self._patterns, address)
        if pattern is None:
            return _NOBODY
        return self._table[pattern].get(permission, _NOBODY)
