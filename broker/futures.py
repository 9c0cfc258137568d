"""Outcomes nobody may wait for: a future whose waiters were cancelled, or that was fired and
forgotten, still ends; unless its outcome is taken, asyncio logs "exception was never
retrieved" for a failure that is reported elsewhere (or dropped by design)."""

from __future__ import annotations

import asyncio
from typing import Any


def taken(future: asyncio.Future[Any]) -> None:
    """A done callback that takes the outcome (a cancelled future has none)."""
    if not future.cancelled():
        future.exception()
