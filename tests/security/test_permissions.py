"""Per-address permissions (broker/permissions.py): Artemis security-settings semantics."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import wildcard
from broker.config_security import PERMISSIONS, Permission, SecuritySection
from broker.permissions import Authorizer, Denied
from broker.users import Principal

# The issue's example.
ISSUE_ROLES: dict[str, dict[Permission, list[str]]] = {
    "orders.#": {"send": ["app"], "consume": ["worker"], "browse": ["ops"], "manage": ["admin"]},
    "#": {
        "send": ["admin"],
        "consume": ["admin"],
        "create": ["admin"],
        "delete": ["admin"],
        "manage": ["admin"],
    },
}


def who(*roles: str, name: str = "u") -> Principal:
    return Principal(name, frozenset(roles))


APP, WORKER, OPS, ADMIN = who("app"), who("worker"), who("ops"), who("admin")


@pytest.mark.parametrize(
    ("principal", "permission", "address", "allowed"),
    [
        (APP, "send", "orders", True),  # '#' matches zero words
        (APP, "send", "orders.eu", True),
        (APP, "send", "orders.eu.x", True),
        (APP, "consume", "orders.eu", False),
        (WORKER, "consume", "orders.eu", True),
        (WORKER, "send", "orders.eu", False),
        (OPS, "browse", "orders.eu", True),
        (ADMIN, "manage", "orders.eu", True),
        # orders.# decides alone: what it does not list nobody has, admin included.
        (ADMIN, "send", "orders.eu", False),
        (ADMIN, "consume", "orders.eu", False),
        (ADMIN, "create", "orders.eu", False),
        (ADMIN, "delete", "orders.eu", False),
        (ADMIN, "browse", "orders.eu", False),  # nor under '#' either
        # Elsewhere '#' decides.
        (ADMIN, "send", "invoices", True),
        (ADMIN, "create", "invoices.eu", True),
        (APP, "send", "invoices", False),
        (ADMIN, "browse", "invoices", False),
        (APP, "send", "ordersx", False),  # not under orders.#: a different word
    ],
)
def test_the_issues_roles_table(
    principal: Principal, permission: Permission, address: str, allowed: bool
) -> None:
    assert Authorizer(ISSUE_ROLES).allows(principal, permission, address) is allowed


def test_one_word_against_any_words_and_exact_names() -> None:
    auth = Authorizer(
        {
            "orders.*": {"send": ["star"]},
            "orders.#": {"send": ["hash"]},
            "orders.eu": {"send": ["exact"]},
        }
    )
    assert auth.granted("send", "orders.eu") == {"exact"}  # exact beats any wildcard
    assert auth.granted("send", "orders.us") == {"star"}  # '*' beats '#' (fewer '#')
    assert auth.granted("send", "orders.us.x") == {"hash"}  # '*' is one word only
    assert auth.granted("send", "orders") == {"hash"}  # '#' may be no word
    assert auth.granted("send", "other") == frozenset()  # no pattern matches: nobody
    assert not auth.allows(who("star", "hash", "exact"), "consume", "orders.eu")


def test_more_literal_words_win() -> None:
    auth = Authorizer({"a.b.#": {"send": ["ab"]}, "a.#": {"send": ["a"]}, "#.c": {"send": ["c"]}})
    assert auth.granted("send", "a.b.c") == {"ab"}
    assert auth.granted("send", "a.x.c") == {"a"}  # a tie, settled by the pattern text
    assert auth.granted("send", "z.c") == {"c"}


def test_a_principal_needs_one_of_the_granted_roles() -> None:
    auth = Authorizer({"#": {"send": ["a", "b"]}})
    assert auth.allows(who("x", "b"), "send", "q")
    assert not auth.allows(who("x", "y"), "send", "q")
    assert not auth.allows(who(), "send", "q")


def test_no_patterns_denies_everything() -> None:
    auth = Authorizer({})
    assert not any(auth.allows(ADMIN, p, "q") for p in PERMISSIONS)
    assert not auth.allows_global(ADMIN, "manage")


def test_the_default_roles_let_admin_do_everything_and_no_one_else() -> None:
    auth = Authorizer(SecuritySection().roles)
    for permission in PERMISSIONS:
        assert auth.allows(ADMIN, permission, "any.address")
        assert not auth.allows(APP, permission, "any.address")
        assert auth.allows_global(ADMIN, permission)


def test_check_raises_denied_naming_user_permission_and_address() -> None:
    auth = Authorizer(ISSUE_ROLES)
    auth.check(APP, "send", "orders.eu")
    with pytest.raises(Denied) as caught:
        auth.check(who("app", name="bob"), "consume", "orders.eu")
    assert str(caught.value) == "user 'bob' lacks permission 'consume' on address 'orders.eu'"
    assert (caught.value.user, caught.value.permission, caught.value.address) == (
        "bob",
        "consume",
        "orders.eu",
    )


def test_operations_without_an_address_need_the_permission_under_hash_itself() -> None:
    auth = Authorizer(ISSUE_ROLES)
    assert auth.allows_global(ADMIN, "manage")
    assert not auth.allows_global(ADMIN, "browse")  # '#' does not list browse
    assert not auth.allows_global(OPS, "manage")
    auth.check_global(ADMIN, "manage")
    with pytest.raises(Denied, match=r"user 'u' lacks permission 'manage' on every address"):
        auth.check_global(OPS, "manage")
    # Without a '#' entry, nobody: manage on orders.# is not manage everywhere.
    narrow = Authorizer({"orders.#": {"manage": ["admin"]}})
    assert narrow.allows(ADMIN, "manage", "orders.eu")
    assert not narrow.allows_global(ADMIN, "manage")
    assert narrow.granted_global("manage") == frozenset()


def test_unknown_permission_in_the_table_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown permission 'publish'"):
        Authorizer({"#": {"publish": ["a"]}})  # type: ignore[dict-item]


def test_a_tiny_cache_still_gives_the_same_answers() -> None:
    auth = Authorizer(ISSUE_ROLES, cache_size=2)
    addresses = ["orders.eu", "invoices", "orders", "x.y", "orders.eu"] * 3
    first = [auth.granted(p, a) for a in addresses for p in PERMISSIONS]
    again = [auth.granted(p, a) for a in addresses for p in PERMISSIONS]
    assert first == again
    assert auth.granted("send", "orders.eu") == {"app"}


# A reference that caches nothing: the most specific matching pattern, straight from the table.


def reference(
    roles: dict[str, dict[Permission, list[str]]], permission: Permission, address: str
) -> frozenset[str]:
    matching = [p for p in roles if wildcard.matches(p, address)]
    best = wildcard.most_specific(matching, address)
    return frozenset(roles[best].get(permission, [])) if best is not None else frozenset()


WORDS = st.sampled_from(["orders", "eu", "us", "x", "invoices"])
PATTERN_WORDS = st.one_of(WORDS, st.sampled_from(["#", "*"]))
PATTERNS = st.lists(PATTERN_WORDS, min_size=1, max_size=4).map(".".join)
ADDRESSES = st.lists(WORDS, min_size=1, max_size=4).map(".".join)
ROLE_NAMES = st.lists(st.sampled_from(["app", "worker", "ops", "admin"]), max_size=3)
TABLES = st.dictionaries(
    PATTERNS, st.dictionaries(st.sampled_from(PERMISSIONS), ROLE_NAMES, max_size=6), max_size=6
)


@settings(max_examples=300, deadline=None)
@given(
    roles=TABLES,
    checks=st.lists(
        st.tuples(st.sampled_from(PERMISSIONS), ADDRESSES, ROLE_NAMES), min_size=1, max_size=30
    ),
    cache_size=st.sampled_from([1, 4, 65_536]),
)
def test_the_cached_authorizer_agrees_with_an_uncached_reference(
    roles: dict[str, dict[Permission, list[str]]],
    checks: list[tuple[Permission, str, list[str]]],
    cache_size: int,
) -> None:
    auth = Authorizer(roles, cache_size=cache_size)
    for permission, address, role_names in checks * 2:  # twice: the second round is cached
        expected = reference(roles, permission, address)
        assert auth.granted(permission, address) == expected
        principal = who(*role_names)
        assert auth.allows(principal, permission, address) == bool(expected & set(role_names))
