"""The one way tests wait: poll a check until it holds, within a bound, and fail naming what
never happened. The bound is there so a broken node fails the test instead of hanging it; it
is never a claim about how long something takes (no test asserts a duration)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

WAIT_S = 30.0
EVERY_S = 0.02


async def until(
    what: str,
    check: Callable[[], Any],
    timeout: float = WAIT_S,
    *,
    every: float = EVERY_S,
    ignoring: tuple[type[BaseException], ...] = (),
    off_loop: bool = False,
) -> Any:
    """Poll `check()` (a function or a coroutine function) until it returns something true;
    returns that. An exception in `ignoring` counts as "not yet" (a node between lives).
    `off_loop`: `check` blocks (a synchronous gRPC call), so it runs in a thread while the
    event loop, and any load on it, goes on."""
    if off_loop:
        return await asyncio.to_thread(wait, what, check, timeout, every=every, ignoring=ignoring)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
        except ignoring:
            value = None
        if value:
            return value
        if loop.time() >= deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(every)


def wait(
    what: str,
    check: Callable[[], Any],
    timeout: float = WAIT_S,
    *,
    every: float = EVERY_S,
    ignoring: tuple[type[BaseException], ...] = (),
) -> Any:
    """`until`, blocking: for tests and helpers that run outside an event loop."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except ignoring:
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(every)
