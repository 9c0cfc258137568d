"""`Outage`: which failures of a link's current outage were logged already.

A link that retries every reconnect-interval meets the same few failures over and over; each
is logged once per outage. Remembering only the last one is not enough: a passive ha process
refuses a link as UNAVAILABLE, but grpcio sometimes reports that refusal as INTERNAL
("Internal error from Core", grpc/grpc#36066), and the two alternate on every retry.
"""

from __future__ import annotations

import asyncio


class Outage:
    """The failures logged since the link was last up."""

    def __init__(self) -> None:
        self._logged: set[str] = set()

    def news(self, reason: str) -> bool:
        """Whether `reason` is new in this outage (then it counts as logged)."""
        if reason in self._logged:
            return False
        self._logged.add(reason)
        return True

    def over(self) -> None:
        """The link was up: its next failure is news again."""
        self._logged.clear()


def raise_if_cancelled() -> None:
    """End a link's retry loop that this task's own cancellation reached as a failure.

    grpcio may report a call cut short by the cancellation of the task awaiting it as an
    RpcError ("Internal error from Core") instead of CancelledError. A loop that retries on
    RpcError would then go on for ever, and whoever cancelled it (to stop following, to stop
    the node) would wait for it for ever. Call this in the loop's except clause.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
