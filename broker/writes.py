"""The store writes that carry out a core call's Effects, and what waits for them.

One write per applied batch of Effects (the store groups concurrent writes into one commit).
`Writes` remembers which write makes each added message durable until it is, because a
delivery of that message, from any later call, must wait for it (`gates`). A failed write is
fatal: the node stops (`fail`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from broker.config import NodeConfig
from broker.effects import Delivery, Effects
from broker.futures import taken
from broker.message import Message
from broker.store_base import StoreBase
from broker.store_reads import StoreError

Write = asyncio.Future[None]


class Writes:
    """Turns Effects into store writes and tracks the writes not yet on disk."""

    def __init__(
        self,
        store: StoreBase,
        config: NodeConfig,
        grouped: Callable[[str], bool],
        fail: Callable[[BaseException], None],
    ) -> None:
        self.store = store
        self._count_which = config.persist_delivery_count_before_delivery
        self._grouped = grouped  # whether a queue groups (store-and-forward queues do not)
        self._fail = fail
        self.unwritten: dict[int, Write] = {}  # msg id -> the write that adds it

    def of(self, fx: Effects, marks: Mapping[str, int] | None) -> tuple[Write | None, bool]:
        """Start the write of `fx` (and forwarding `marks`, in the same transaction).

        Returns the write (None: nothing to store), and whether deliveries of `fx` are counted
        in it (`persist-delivery-count-before-delivery`), so they must wait for it. A dropped
        duplicate's answer waits for its original's write too.
        """
        added = [m for m in fx.added if m.persistent]
        removed = [m for m in fx.removed if m.persistent]
        updated = [m for m in fx.updated if m.persistent]
        counted = self._counted(fx.deliveries)
        ids = fx.duplicate_ids
        write = None
        if added or removed or updated or marks or counted or ids:
            write = self.watch(
                self.store.write(
                    added=added,
                    removed=removed,
                    updated=updated,
                    marks=marks or {},
                    delivered=counted,
                    ids=ids,
                )
            )
            if added:
                self._track(added, write)
        if fx.duplicates:
            write = self._with_originals(fx.duplicates, write)
        return write, bool(counted)

    def gates(self, deliveries: Sequence[Delivery]) -> set[Write | None]:
        """The writes still adding the delivered messages (from earlier calls too)."""
        unwritten = self.unwritten
        if not unwritten:
            return set()
        return {unwritten.get(d.message.msg_id) for d in deliveries}

    def watch(self, write: Coroutine[Any, Any, None]) -> Write:
        """Start a store call now (it joins the next group commit); its failure is fatal."""
        future = asyncio.ensure_future(write)
        future.add_done_callback(self._check)
        return future

    def _check(self, future: Write) -> None:
        if future.cancelled():  # whether it is on disk is unknown, and deliveries wait for it
            self._fail(StoreError(f"{self.store.path}: a store write was cancelled"))
        elif future.exception() is not None:
            self._fail(future.exception())  # type: ignore[arg-type]

    def _with_originals(
        self, duplicates: Sequence[tuple[str, str, int]], write: Write | None
    ) -> Write | None:
        """`write`, and the writes of the dropped duplicates' originals still under way: a
        duplicate is confirmed only once the message it stands for is on disk."""
        unwritten = self.unwritten
        gates = {unwritten.get(original) for _, _, original in duplicates} if unwritten else set()
        gates.add(write)
        pending = [f for f in gates if f is not None and not f.done()]
        if len(pending) <= 1:
            return pending[0] if pending else write
        return asyncio.ensure_future(_all(pending))

    def _counted(self, deliveries: Sequence[Delivery]) -> list[Message]:
        """The delivered messages whose count is stored before they go out."""
        which = self._count_which
        if which == "none" or not deliveries:
            return []
        if which == "all":
            return [d.message for d in deliveries if d.message.persistent]
        grouping: dict[str, bool] = {}
        counted = []
        for d in deliveries:
            m = d.message
            if not m.persistent or m.group is None:
                continue
            if m.queue not in grouping:
                grouping[m.queue] = self._grouped(m.queue)
            if grouping[m.queue]:
                counted.append(m)
        return counted

    def _track(self, added: list[Message], write: Write) -> None:
        """Remember which write makes each added message durable, until it has."""
        unwritten = self.unwritten
        for m in added:
            unwritten[m.msg_id] = write

        def written(_: Write) -> None:
            for m in added:
                if unwritten.get(m.msg_id) is write:
                    del unwritten[m.msg_id]

        write.add_done_callback(written)


def shielded(write: Write) -> Write:
    """What a caller of the engine awaits for `write`: cancelling the caller (a client gone
    mid-send) cancels this, never the write, which later deliveries wait for (a cancelled one
    once stopped every delivery of a node, silently). Its outcome is taken even if nobody
    waits for it: the write's failure fails the node anyway (`_check`)."""
    if write.done():
        return write
    view = asyncio.shield(write)
    view.add_done_callback(taken)
    return view


async def _all(writes: Sequence[Write]) -> None:
    """Wait for every write; the first failure is raised (the node fails with it anyway)."""
    for write in writes:
        await write
