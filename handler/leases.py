"""The leases the LOCAL arbiter granted REMOTE nodes, and when each has certainly run out. Pure.

With `rebind-absent-after` set, a REMOTE node delivers grouped messages only while it holds a
lease from the arbiter (handler/lease_keeper.py keeps it). The node counts its lease from the
moment it *sent* the request, so its lease ends, in real time, no later than `lease` after the
arbiter granted it, as read on the node's clock. The arbiter re-binds an absent node's groups
only once `bound` has passed since its last grant, on its own clock:

    bound = lease * (1 + RATE_DRIFT) + margin

RATE_DRIFT covers the two clocks running at different rates (at most 1%: any working quartz
clock is far better); `margin` covers the node's reaction, the time between its lease running
out and its last grouped delivery being taken back (an event loop that stalls longer than the
margin at that moment is the one case this does not cover).

An arbiter that just started (a restart, or an ha backup taking over) does not know the grants
of the one before it: it counts every node as leased until `bound` after its own start.

Clocks are monotonic nanoseconds, passed in.
"""

from __future__ import annotations

RATE_DRIFT = 0.01
_MS = 1_000_000


class Leases:
    """Per node, the last moment (ns) its lease may still hold."""

    def __init__(self, lease_ms: int, margin_ms: int, started_ns: int) -> None:
        if lease_ms <= 0 or margin_ms < 0:
            raise ValueError("lease_ms must be > 0 and margin_ms >= 0")
        self.lease_ms = lease_ms
        self.bound_ns = int(lease_ms * _MS * (1 + RATE_DRIFT)) + margin_ms * _MS
        self._floor = started_ns + self.bound_ns  # what a predecessor may have granted
        self._until: dict[str, int] = {}

    def grant(self, node: str, now_ns: int) -> int:
        """A lease for `node` from now; the lease in ms, as the node is told."""
        self._until[node] = max(self._until.get(node, 0), now_ns + self.bound_ns)
        return self.lease_ms

    def holds(self, node: str, now_ns: int) -> bool:
        """May `node` still be delivering on a lease (so its groups must not move yet)?"""
        return now_ns < max(self._until.get(node, 0), self._floor)

    def next_expiry(self, now_ns: int) -> int | None:
        """The next moment (ns) a lease that holds now runs out, or None: lets a shell sleep."""
        ends = [t for t in (self._floor, *self._until.values()) if t > now_ns]
        return min(ends) if ends else None
