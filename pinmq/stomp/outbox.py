"""What a STOMP session sends, in order, each frame only once the store write it waits for is done.

A RECEIPT must not overtake the write that makes its SEND durable, nor a frame queued before
it; a write that fails ends the connection with an ERROR frame instead of the frames behind it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from pinmq.stomp.protocol import CLOSE, Close


class Outbox:
    """Frames for the connection's writer (`out`), gated by store writes, in queueing order."""

    def __init__(self, out: asyncio.Queue[Any], on_write_failed: Callable[[str], bytes]) -> None:
        self.out = out
        self.pending_bytes = 0  # control frames queued on `out`, not yet written
        self.closed = False  # CLOSE was queued: nothing more goes out
        self._on_write_failed = on_write_failed
        self._chain: deque[tuple[asyncio.Future[None] | None, bytes | Close]] = deque()

    def after(self, gate: asyncio.Future[None] | None, item: bytes | Close) -> None:
        """Queue `item` once `gate` (a store write) resolved and everything queued before it."""
        waiting = gate is not None and not gate.done()
        if not self._chain and not waiting:
            self._emit(gate, item)
            return
        self._chain.append((gate, item))
        if waiting:
            gate.add_done_callback(self._advance)  # type: ignore[union-attr]

    def _advance(self, _done: object = None) -> None:
        chain = self._chain
        while chain:
            gate, item = chain[0]
            if gate is not None and not gate.done():
                return
            chain.popleft()
            self._emit(gate, item)

    def _emit(self, gate: asyncio.Future[None] | None, item: bytes | Close) -> None:
        if gate is not None and (gate.cancelled() or gate.exception() is not None):
            if not self.closed:
                reason = "cancelled" if gate.cancelled() else str(gate.exception())
                self.put(self._on_write_failed(f"store write failed: {reason}"))
                self.put(CLOSE)
            return
        self.put(item)

    def put(self, item: bytes | Close) -> None:
        """Queue `item` now (heart-beats, and the emitted ones)."""
        if self.closed:
            return
        if item is CLOSE:
            self.closed = True
        else:
            self.pending_bytes += len(item)  # type: ignore[arg-type]
        self.out.put_nowait(item)
