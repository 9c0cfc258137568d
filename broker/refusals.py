"""Requests a node refused, by protocol and reason, for `GET /metrics`.

The reason is the gRPC status code name the refusal carries (a STOMP ERROR frame gets the
name of its cause's code too), so a dashboard shows one set of reasons across protocols: a
burst of PERMISSION_DENIED or RESOURCE_EXHAUSTED says what to fix, whichever client saw it.
"""

from __future__ import annotations

from collections import Counter


class Refusals:
    """Counts kept by the protocol shells as they refuse; read at scrape time."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()

    def count(self, protocol: str, reason: str) -> None:
        """One request of `protocol` refused with `reason` (a status code name)."""
        self.counts[protocol, reason] += 1
