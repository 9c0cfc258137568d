"""A bound on a long drill that turns a hang into a failure which shows where it hung.

`asyncio.timeout` cancels first, and the awaits that hung are gone by the time the test fails.
This dumps every task's and every thread's stack before it cancels, so a drill that hangs once
in a CI run says which await never finished instead of running into the CI's own limit.
"""

from __future__ import annotations

import asyncio
import sys
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


def dump_stacks(why: str) -> None:
    """Every asyncio task's and every thread's stack, on stderr (pytest shows it on failure)."""
    out = sys.stderr
    print(f"=== {why}: the stacks of every task and thread ===", file=out)
    for task in asyncio.all_tasks():
        print(f"--- task {task.get_name()}", file=out)
        task.print_stack(limit=12, file=out)
    for ident, frame in sys._current_frames().items():
        print(f"--- thread {ident}", file=out)
        traceback.print_stack(frame, limit=12, file=out)


@asynccontextmanager
async def watchdog(seconds: float, what: str) -> AsyncIterator[None]:
    """The block within `seconds`, or TimeoutError after the stacks were dumped."""
    task = asyncio.current_task()
    assert task is not None
    fired = False

    def fire() -> None:
        nonlocal fired
        fired = True
        dump_stacks(f"{what} still running after {seconds:g} s")
        task.cancel()

    handle = asyncio.get_running_loop().call_later(seconds, fire)
    try:
        yield
    except asyncio.CancelledError:
        if fired and task.uncancel() == 0:
            raise TimeoutError(f"{what} did not finish in {seconds:g} s: stacks above") from None
        raise
    finally:
        handle.cancel()
