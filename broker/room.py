"""Room for messages: memory budgets, the data volume, the disk reserve and blocked producers.

The pure rules are `broker/budget.py`'s; this is their asyncio side. A client's send asks
`admit` first: FAIL raises AddressFull, BLOCK returns a coroutine that waits until acks free
room. The data volume is looked at every tick and every MiB of persistent bytes sent: above
`limits.max-disk-usage` persistent sends are refused. The disk reserve (`broker/disk.py`) is
a file of `limits.disk-reserve` bytes kept while there is room, released when the store hits
a full disk, so that the node can still commit what lets consumers drain it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from broker import disk, logs
from broker.config import NodeConfig
from broker.core import AddressFull, BrokerCore
from broker.store_base import StoreBase

DISK_POLL_BYTES = 1 << 20  # the data volume is looked at again after this many bytes sent
GIVEBACK_S = 1.0  # at most this often, a tight disk gets the store's free pages back
log = logs.get("node")


class Room:
    """Admission of client sends, the blocked producers, and the data volume's state."""

    def __init__(
        self, core: BrokerCore, config: NodeConfig, store: Callable[[], StoreBase | None]
    ) -> None:
        self._core = core
        self._config = config
        self._store = store  # None until the engine opened it
        self.data_dir = Path(config.node.data_dir)
        self.reserve = disk.Reserve(self.data_dir, config.limits.disk_reserve)
        self._sent_bytes = 0  # persistent bytes sent since the data volume was last looked at
        self._next_giveback = 0.0  # when the store may next be asked to give space back
        self._space = asyncio.Event()  # replaced once set: wakes producers blocked (BLOCK)
        self.blocked = 0  # producers waiting for room

    # ---- producers -----------------------------------------------------------------------

    def admit(self, addresses: Sequence[tuple[str, bool]]) -> Coroutine[Any, Any, None] | None:
        """May a client send these (address, persistent) now? None: yes. Raises AddressFull
        (FAIL); returns what to await when the send must wait for room (BLOCK)."""
        try:
            self._admit_all(addresses)
        except AddressFull as full:
            if not full.block:
                raise
            return self._blocked(addresses, str(full))
        return None

    def _admit_all(self, addresses: Sequence[tuple[str, bool]]) -> None:
        for address, persistent in addresses:
            self._core.admit(address, persistent)

    async def _blocked(self, addresses: Sequence[tuple[str, bool]], reason: str) -> None:
        self.blocked += 1
        if self.blocked == 1:  # once per spell, not per send
            log.warning("producers blocked until there is room", reason=reason)
        try:
            while True:
                await self._space.wait()
                try:
                    self._admit_all(addresses)
                    return
                except AddressFull as full:
                    if not full.block:
                        raise
        finally:
            self._unblock()

    def _unblock(self) -> None:
        self.blocked -= 1
        if not self.blocked:
            log.info("no producer blocked any more")

    async def memory_room(self) -> None:
        """Wait until the node holds less than limits.global-max-size (a paused STOMP read)."""
        self.blocked += 1
        try:
            while self._core.budget.node.full:
                await self._space.wait()
        finally:
            self._unblock()

    def freed(self) -> None:
        """Messages left memory: blocked producers look again."""
        if self.blocked:
            self._space.set()
            self._space = asyncio.Event()

    def sent(self, nbytes: int) -> None:
        """Persistent bytes were sent: look at the data volume again every DISK_POLL_BYTES."""
        self._sent_bytes += nbytes
        if self._sent_bytes >= DISK_POLL_BYTES:
            self.watch_disk()

    # ---- the data volume -------------------------------------------------------------------

    def watch_disk(self) -> None:
        """Look at the data volume: refuse persistent sends above max-disk-usage, and keep
        the reserve while there is room for it."""
        self._sent_bytes = 0
        limit = self._config.limits.max_disk_usage
        budget = self._core.budget
        store = self._store()
        try:
            usage = disk.usage(self.data_dir)
        except OSError as err:
            log.warning("cannot read the data volume's usage", error=str(err))
            return
        if store is not None:  # the store's free pages take new messages first
            free_pages = min(usage.used, store.free_bytes)
            usage = disk.Usage(usage.used - free_pages, usage.free + free_pages)
        percent = usage.percent()
        full = limit < 100 and percent >= limit
        budget.disk_percent = percent
        if full != budget.disk_full:
            budget.disk_full = full
            if full:
                log.warning(
                    "data volume above limits.max-disk-usage: persistent sends refused",
                    percent=round(percent, 1),
                    limit=limit,
                )
            else:
                log.info(
                    "data volume below limits.max-disk-usage: sends resume",
                    percent=round(percent, 1),
                )
                self.freed()
        reserve = self.reserve
        if not (full or reserve.held or not reserve.size) and reserve.take():
            log.info("disk reserve taken", bytes=reserve.size)
        tight = full or (reserve.size and not reserve.held)
        now = time.monotonic()
        if tight and store is not None and store.free_bytes and now >= self._next_giveback:
            self._next_giveback = now + GIVEBACK_S
            store.give_back_space()

    def resources(self) -> dict[str, Any]:
        """Memory, disk and blocked producers, as health reports them."""
        budget, store = self._core.budget, self._store()
        return {
            "memory_bytes": budget.node.bytes,
            "global_max_size": budget.node.limit,
            "memory_full": budget.node.full,
            "blocked_producers": self.blocked,
            "disk_percent": round(budget.disk_percent, 1),
            "max_disk_usage": self._config.limits.max_disk_usage,
            "disk_full": budget.disk_full,
            "disk_reserve_held": self.reserve.held,
            "store_waits_for_space": store is not None and store.waiting_for_space,
        }
