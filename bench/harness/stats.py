"""Percentiles and the checks every load benchmark makes of what its consumers received."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T", int, float)

Checks = dict[str, tuple[bool, str]]  # check name -> (passed, one-line reason)


def pct(ordered: Sequence[T], q: float) -> T:
    """The q-quantile (0..1) of an already sorted, non-empty sequence (nearest rank below)."""
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def passed(checks: Checks) -> bool:
    return all(ok for ok, _ in checks.values())


def order_and_owners(
    consumers: Iterable[tuple[str, Iterable[tuple[str, Hashable, int]]]],
) -> tuple[int, dict[str, set[str]]]:
    """Out-of-order deliveries, and which consumers saw each group.

    `consumers`: (consumer name, its deliveries in arrival order as (group, stream, seq)).
    A stream (a group, or a group and its producer) must arrive with rising seq at each
    consumer; group '' (ungrouped) has no owner.
    """
    disorder = 0
    owners: dict[str, set[str]] = {}
    for name, deliveries in consumers:
        last: dict[Hashable, int] = {}
        for group, stream, seq in deliveries:
            if seq <= last.get(stream, 0):
                disorder += 1
            last[stream] = seq
            if group:
                owners.setdefault(group, set()).add(name)
    return disorder, owners


def order_checks(
    consumers: Iterable[tuple[str, Iterable[tuple[str, Hashable, int]]]], spread: str = ""
) -> Checks:
    """The per-group order and one-consumer-per-group checks of `order_and_owners`."""
    disorder, owners = order_and_owners(consumers)
    shared = sum(1 for o in owners.values() if len(o) > 1)
    return {
        "per-group order": (disorder == 0, f"{disorder} out-of-order deliveries"),
        "one consumer per group": (
            shared == 0,
            f"{shared} groups at >1 consumer" + (f"; {spread}" if spread else ""),
        ),
    }
