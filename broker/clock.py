"""The clock the shells pass to the pure core."""

from __future__ import annotations

import time


def now_ns() -> int:
    """Wall-clock time: stored with messages, so it must mean the same after a restart."""
    return time.time_ns()
