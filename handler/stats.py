"""What a grouping handler counts for /metrics: decisions asked for, how long they took, the
ones that timed out, and bindings removed by reason.

Both handlers keep one (`GroupingHandler.stats`): the LOCAL one counts the proposals it
decides (its own node's and those the REMOTE nodes send it) and the time to make a new
binding durable; a REMOTE one counts the proposals it sends and the round trip to the
arbiter. A decision costs a dict lookup and a histogram bucket here, no more.
"""

from __future__ import annotations

from broker.histogram import Histogram

NS_PER_MS = 1_000_000
# A decision takes a write of the bindings file (LOCAL) or a round trip to it (REMOTE): from a
# tenth of a millisecond to the handler's timeout (5 s by default).
DECISION_BOUNDS_NS = tuple(
    int(ms * NS_PER_MS) for ms in (0.1, 0.5, 1, 2.5, 5, 10, 25, 100, 500, 1000, 5000)
)


class HandlerStats:
    """Counted since the node started."""

    __slots__ = ("created", "decisions", "proposals", "removals", "timeouts")

    def __init__(self) -> None:
        self.proposals = 0  # decisions asked for (LOCAL: received; REMOTE: sent)
        self.created = 0  # proposals that made a new binding (LOCAL)
        self.timeouts = 0  # decisions that did not come within the handler's timeout
        self.decisions = Histogram(DECISION_BOUNDS_NS)  # ns from asking to the answer
        self.removals: dict[str, int] = {}  # bindings removed, by RemovalReason

    def removed(self, reason: str, count: int) -> None:
        self.removals[reason] = self.removals.get(reason, 0) + count
