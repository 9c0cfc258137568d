"""Reading paged messages back into memory: the asyncio side of paging (`Queue.wanted`).

Under address-full-policy PAGE a queue keeps some groups' newest messages on disk only. While
their address has room, the pager reads back the groups that can be delivered now (an owner
with credit, or none) or are held (to be moved on), oldest first, so a group whose consumer
is stuck never holds the others back; when there is no room, groups that cannot move give
theirs back first (`Queue.spill`). Reads run in a thread, off the loop, and only once the
newest paged write is on disk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from broker import logs
from broker.budget import footprint
from broker.clock import now_ns
from broker.core import BrokerCore
from broker.effects import Effects
from broker.store_base import StoreBase

PAGE_READ = 1000  # paged messages of one group read back at once, at most
PAGE_GROUPS = 200  # groups read back at once, at most (one store read)
PAGE_GUESS_BYTES = 2048  # a paged message's footprint before any has been read
log = logs.get("node")


class Pager:
    """Runs while the node does; `wake` it when memory may have room for paged messages."""

    def __init__(
        self,
        core: BrokerCore,
        store: StoreBase,
        unwritten: Mapping[int, asyncio.Future[None]],
        apply: Callable[[Effects], object],
    ) -> None:
        self._core = core
        self._store = store
        self._unwritten = unwritten  # msg id -> the write that adds it (broker/writes.py)
        self._apply = apply
        self._room = asyncio.Event()
        self._room.set()  # queues restored paged may have room already

    def wake(self) -> None:
        if self._core.paging:
            self._room.set()

    async def run(self) -> None:
        average = PAGE_GUESS_BYTES  # a paged message's footprint, from the last read
        while True:
            await self._room.wait()
            self._room.clear()
            for name in list(self._core.paging):
                average = await self._read_back(name, average)
                if average < 0:
                    return  # a write failed: the node fails

    async def _read_back(self, name: str, average: int) -> int:
        """Read `name`'s wanted groups back while it has room; the new average footprint,
        or -1 if a write it waited for failed."""
        core = self._core
        while name in core.paging:
            q = core.queue(name)
            room = q.meter.room()
            each = max(1, min(PAGE_READ, room // average // PAGE_GROUPS))
            wanted = q.wanted(PAGE_GROUPS, each)
            if not wanted:
                break
            if room <= 0:  # make room: groups that cannot move give theirs back
                q.spill(self._unwritten, len(wanted) * average - room)
                if q.meter.room() <= 0:
                    break
            tail = self._unwritten.get(q.page_last)
            if tail is not None:  # writes commit in order: then every paged one is on disk
                if not tail.done():
                    await asyncio.wait([tail])
                    continue
                # Done, its callbacks (one drops it from `unwritten`) not run yet: awaiting it
                # would not yield, and this loop would spin without ever letting them run.
                if tail.cancelled() or tail.exception() is not None:
                    return -1
            ids = [msg_ids for _, msg_ids in wanted]
            pages = await asyncio.to_thread(self._store.read_ids, name, ids)
            read = [m for page in pages for m in page]
            for m in read:
                m.size = footprint(m)
            if read:
                average = max(1, sum(m.size for m in read) // len(read))
            fx = Effects()
            for (group, msg_ids), page in zip(wanted, pages, strict=True):
                if len(page) != len(msg_ids):
                    log.error(
                        "paged messages not in the store",
                        queue=name,
                        group=group,
                        missing=len(msg_ids) - len(page),
                    )
                fx.merge(core.page_in(name, group, msg_ids, page, now_ns()))
            self._apply(fx)
        return average
