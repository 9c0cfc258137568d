"""Artemis address wildcards, used to pick the address-settings entry for an address.

An address is a list of words separated by ``.``. In a pattern, the word ``#`` matches
zero or more words and the word ``*`` matches exactly one word; any other word (including
one that merely contains ``#`` or ``*``) must match literally. So ``orders.#`` matches
``orders``, ``orders.eu`` and ``orders.eu.x``, while ``orders.*`` matches only ``orders.eu``.

Specificity, used when several patterns match one address (see `most_specific`):

1. an exact pattern (no wildcard word) beats any wildcard pattern;
2. then the pattern with more literal words wins;
3. then the one with fewer ``#`` words;
4. then the one with fewer ``*`` words;
5. then the longer pattern string, and finally the pattern string itself (so the answer
   never depends on the order the patterns were given in).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

SEPARATOR = "."
ANY_WORDS = "#"
ONE_WORD = "*"


@dataclass(frozen=True, slots=True)
class Pattern:
    """A compiled pattern: a regex over ``"." + address`` plus its specificity rank."""

    text: str
    regex: re.Pattern[str]
    rank: tuple[bool, int, int, int, int, str]

    def matches(self, address: str) -> bool:
        return self.regex.fullmatch(SEPARATOR + address) is not None


@lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> Pattern:
    """Compile once: every word consumes its own leading separator, so ``#`` can vanish."""
    words = pattern.split(SEPARATOR)
    parts = []
    for word in words:
        if word == ANY_WORDS:
            parts.append(r"(?:\.[^.]*)*")
        elif word == ONE_WORD:
            parts.append(r"\.[^.]*")
        else:
            parts.append(r"\." + re.escape(word))
    hashes = words.count(ANY_WORDS)
    stars = words.count(ONE_WORD)
    literals = len(words) - hashes - stars
    rank = (hashes + stars == 0, literals, -hashes, -stars, len(pattern), pattern)
    return Pattern(pattern, re.compile("".join(parts)), rank)


def is_wildcard_word_misuse(pattern: str) -> bool:
    """True when ``#``/``*`` appear inside a word: legal, but almost always a typo."""
    return any(
        (ANY_WORDS in w or ONE_WORD in w) and w not in (ANY_WORDS, ONE_WORD)
        for w in pattern.split(SEPARATOR)
    )


def matches(pattern: str, address: str) -> bool:
    """Whether `address` is covered by `pattern`."""
    return compile_pattern(pattern).matches(address)


def most_specific(patterns: Iterable[str], address: str) -> str | None:
    """The most specific of `patterns` matching `address` (rule in the module doc), or None."""
    return _most_specific(tuple(patterns), address)


@lru_cache(maxsize=4096)
def _most_specific(patterns: tuple[str, ...], address: str) -> str | None:
    # Cached per (pattern set, address): called on every queue auto-create.
    best: Pattern | None = None
    for text in patterns:
        compiled = compile_pattern(text)
        if compiled.matches(address) and (best is None or compiled.rank > best.rank):
            best = compiled
    return best.text if best else None
