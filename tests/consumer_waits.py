"""Where a drill's consumers wait, for a drain that did not finish: each Python consumer's
await chain and its client's state, and the STOMP consumer thread's stack."""

from __future__ import annotations

import asyncio
import sys
import traceback
from typing import Any

from ha_load import HaLoad


def where(load: HaLoad) -> str:
    """Where each consumer waits (its await chain, and its Python consumer's state), for
    a drain that did not finish."""
    lines = []
    for w in load.workers:
        if w.task is None or w.task.done():
            continue
        lines.append(f"{w.name}: held {len(w.held)}; awaits {_awaits(w.task)}")
        consumer = w.task.get_coro().cr_frame.f_locals.get("consumer")  # Worker.run's
        if consumer is not None:
            call = consumer._call
            lines.append(
                f"  consumer at {consumer._client.target} (gen {consumer._generation}/"
                f"{consumer._client.generation}): buffered {len(consumer._buffer)}, "
                f"receipts {sorted(consumer._receipts)}, resuming {consumer._resuming}, "
                f"ended {consumer._ended}, call done {call is None or call.done()}"
            )
    thread = load.stomp_consumer.thread
    frame = sys._current_frames().get(thread.ident) if thread.ident is not None else None
    if frame is not None:
        stack = traceback.format_stack(frame)[-4:]
        lines.append("stomp-consumer thread:\n" + "".join(stack).rstrip())
    return "\n".join(lines)


def _awaits(task: asyncio.Task[Any]) -> str:
    """A task's await chain, innermost last: function:line of each coroutine."""
    links, coro = [], task.get_coro()
    while coro is not None and getattr(coro, "cr_frame", None) is not None:
        frame = coro.cr_frame
        links.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
        coro = coro.cr_await
    if coro is not None:
        links.append(type(coro).__name__)
    return " > ".join(links)
