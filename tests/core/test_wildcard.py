"""Artemis wildcard matching and the specificity rule used to pick address-settings."""

from __future__ import annotations

import pytest

from broker.wildcard import is_wildcard_word_misuse, matches, most_specific


@pytest.mark.parametrize(
    ("pattern", "address", "expected"),
    [
        ("#", "orders", True),
        ("#", "orders.eu.x", True),
        ("orders.#", "orders", True),  # '#' matches zero words
        ("orders.#", "orders.eu", True),
        ("orders.#", "orders.eu.x", True),
        ("orders.#", "ordersx", False),
        ("orders.#", "other.orders", False),
        ("#.x", "x", True),
        ("#.x", "orders.eu.x", True),
        ("#.x", "orders.x.y", False),
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("a.#.b", "a.x.y", False),
        ("orders.*", "orders.eu", True),  # '*' exactly one word
        ("orders.*", "orders", False),
        ("orders.*", "orders.eu.x", False),
        ("*.eu", "orders.eu", True),
        ("*", "orders", True),
        ("*", "orders.eu", False),
        ("orders.*.x", "orders.eu.x", True),
        ("orders", "orders", True),
        ("orders", "orders.eu", False),
        ("or.ers", "orXers", False),  # '.' is a separator, not a regex dot
        ("ord*", "orders", False),  # wildcards only count as whole words
        ("ord*", "ord*", True),
    ],
)
def test_matches(pattern: str, address: str, expected: bool) -> None:
    assert matches(pattern, address) is expected


@pytest.mark.parametrize(
    ("patterns", "address", "expected"),
    [
        (["#", "orders.#"], "orders.eu", "orders.#"),
        (["#", "orders.#", "orders.eu"], "orders.eu", "orders.eu"),  # exact beats wildcards
        (["orders.*.x", "orders.eu.#"], "orders.eu.x", "orders.*.x"),  # same literals: fewer "#"
        (["orders.#", "orders.*"], "orders.eu", "orders.*"),  # fewer '#' wins
        (["*.*", "#"], "a.b", "*.*"),
        (["*.#", "#.*"], "a.b", "*.#"),  # full tie is broken deterministically
        (["orders.#", "orders.eu.*"], "orders.eu.x", "orders.eu.*"),  # more literal words
        (["billing.#"], "orders", None),
        ([], "orders", None),
    ],
)
def test_most_specific(patterns: list[str], address: str, expected: str | None) -> None:
    assert most_specific(patterns, address) == expected
    assert most_specific(reversed(patterns), address) == expected  # order independent


def test_exact_beats_wildcard_with_more_literals() -> None:
    assert most_specific(["a.b.c.#", "a.b.c"], "a.b.c") == "a.b.c"


def test_wildcard_word_misuse() -> None:
    assert is_wildcard_word_misuse("orders.#x")
    assert is_wildcard_word_misuse("ord*")
    assert not is_wildcard_word_misuse("orders.*.#")
