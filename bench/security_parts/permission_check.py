"""Part 4 of bench/security.py: the permission check per message, in this process.

`Access.check("send", address)` with 50 address patterns: security off, a cached answer, a new
connection's first ask of an address the node has answered before, and the node's first ask
(the most specific pattern wins).
"""

from __future__ import annotations

import statistics
import timeit
from collections.abc import Callable, Sequence
from typing import Any

from broker.access import OPEN, Access
from broker.permissions import Authorizer
from broker.users import Principal
from security_parts.variants import USER

PATTERNS = 50  # address patterns of the permission microbenchmark
ADDRESSES = 2_000  # distinct addresses per microbenchmark pass


def permission_check_ns(repeats: int) -> dict[str, tuple[float, float]]:
    """ns per `Access.check("send", address)`, (median, min) over `repeats` passes of
    ADDRESSES distinct addresses: security off, a cached answer, a new connection's first
    ask of an address the node has answered before, and the node's first ask of it."""
    tenants = (PATTERNS - 2) // 3
    roles: dict[str, dict[Any, list[str]]] = {"#": {"send": [USER]}, "audit.*": {"send": [USER]}}
    for t in range(tenants):  # three patterns per tenant, all matching its order queues
        for pattern in (f"t{t}.#", f"t{t}.orders.#", f"t{t}.orders.*.eu"):
            roles[pattern] = {"send": [USER, "app"], "consume": ["worker"]}
    assert len(roles) == PATTERNS, len(roles)
    admin = Principal(USER, frozenset({USER}))
    passes: dict[str, list[float]] = {k: [] for k in ("off", "cached", "known", "first")}

    def per_check(check: Callable[[str, str], None], addresses: Sequence[str]) -> float:
        def run() -> None:
            for a in addresses:
                check("send", a)

        return timeit.timeit(run, number=1) / len(addresses) * 1e9

    for r in range(repeats):
        addresses = [f"t{i % tenants}.orders.r{r}q{i}.eu" for i in range(ADDRESSES)]
        authorizer = Authorizer(roles)
        first = Access(admin, authorizer)
        passes["first"].append(per_check(first.check, addresses))  # nobody asked before
        passes["cached"].append(per_check(first.check, addresses))  # this connection asked
        passes["known"].append(per_check(Access(admin, authorizer).check, addresses))
        passes["off"].append(per_check(OPEN.check, addresses))
    return {k: (statistics.median(v), min(v)) for k, v in passes.items()}


def print_permission_check(checks: dict[str, tuple[float, float]]) -> None:
    """The summary's lines of the permission check (ns per check)."""
    print(f"\npermission check, Access.check('send', address), {PATTERNS} patterns (ns/check)")
    names = {
        "off": "security off (OPEN)",
        "cached": "cached answer: this connection asked before",
        "known": "new connection, the node answered the address before",
        "first": f"first ask on the node: most specific of {PATTERNS} patterns",
    }
    for k, name in names.items():
        med, low = checks[k]
        print(f"  {name:<58}{med:>8,.0f} (min {low:,.0f})")
