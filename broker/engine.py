"""The engine: the one door to a node's core, and the asyncio shell around it and its store.

Protocol shells, the cluster and ha code change a node only through the engine: the commands
of a `Unit` (`unit()`: consumers, settles, routing, forwarded messages, group moves) and the
queue commands here (`create_queue`, `delete_queue`). Every command's Effects are carried out
by `_apply`, in one place, in this order: fencing (a process that no longer holds its ha
node carries out nothing), the audit log, logging, the store write (`broker/writes.py`), and
the deliveries, which reach consumer streams in the order the core produced them and never
before the messages they carry are on disk (`broker/streams.py`). Room for messages lives in
`broker/room.py`, reading paged messages back in `broker/pager.py`.

Everything runs on the event loop thread. The engine knows nothing above it: what the layers
above must hear about (queues created or deleted, consumers coming and going) goes to the
`Observer`s they register. Everything else they may read goes through the queries below,
which hand out read-only views (`QueueView`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Coroutine, Sequence
from typing import Any, Literal, Protocol

from pydantic import ValidationError

from broker import logs
from broker.audit import node_audit
from broker.clock import now_ns
from broker.config import NodeConfig, QueueConfig
from broker.core import BrokerCore, CoreError
from broker.effects import Effects
from broker.futures import taken
from broker.info import ConsumerInfo, GroupInfo, LaggingGroup, QueueCounts
from broker.kept_index import KeptIndex
from broker.pager import Pager
from broker.queue_stats import QueueTotals
from broker.room import Room
from broker.store_base import StoreBase
from broker.store_files import open_store, store_path
from broker.store_reads import StoreClosed, StoreError
from broker.streams import Outlets, ReceiptFor
from broker.unit import Unit
from broker.writes import Write, Writes, shielded

TICK_S = 0.05
SWEEP_S = 1.0  # how often idle auto-created queues are looked for
AUTO_CREATED = "pinmq-auto-created"  # marks a stored queue definition as auto-created
# How a start read the store back: its index kept by an ha backup while following, its
# index scanned (SQLite), or every message whole (the journal).
Restored = Literal["kept index", "store index", "whole messages"]
log = logs.get("node")


class NotServing(Exception):
    """This process stopped holding its logical node (an ha pair member that lost its
    quorum): nothing more is carried out, and the node stops."""


class StartupError(Exception):
    """The node cannot start; the message names what (file, address) and why."""


class Observer(Protocol):
    """What a layer above the engine hears about (the cluster announces it to its peers)."""

    def queues_changed(self) -> None: ...

    def consumers_changed(self, queue: str) -> None: ...

    def queue_deleted(self, queue: str) -> None: ...


class QueueView(Protocol):
    """What the layers above may read of a queue (`broker/queue.py`'s Queue): no mutators."""

    @property
    def name(self) -> str: ...

    @property
    def address(self) -> str: ...

    @property
    def settings(self) -> QueueConfig: ...

    @property
    def depth(self) -> int: ...

    @property
    def consumer_count(self) -> int: ...

    @property
    def ungrouped_pending(self) -> int: ...

    def counts(self) -> QueueCounts: ...

    @property
    def totals(self) -> QueueTotals: ...  # read them: the queue counts, never its reader

    def lagging(self, k: int) -> tuple[list[LaggingGroup], list[LaggingGroup]]: ...

    def groups(self) -> list[GroupInfo]: ...

    def consumers(self, now_ns: int) -> list[ConsumerInfo]: ...

    def has_group(self, group: str) -> bool: ...

    def held_waiting(self, group: str) -> bool: ...


def _settings(settings: QueueConfig) -> dict[str, object]:
    return settings.model_dump(mode="json", by_alias=True)


class Engine:
    """Core + store + consumer streams + the tick; `open` it, then `start` its loops.

    `serving`: for an ha pair's active process, whether it still holds its node
    (`PairShell.may_serve`); once it answers False, nothing more is carried out.
    """

    def __init__(self, config: NodeConfig, serving: Callable[[], bool] | None = None) -> None:
        self.config = config
        self._core = core = BrokerCore(config)
        self.store_path = store_path(config)
        self.observers: list[Observer] = []
        self.failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        # The audit log (broker/audit.py; None unless on) records what this engine may carry out.
        self.audit = node_audit(config, self._may_carry_out)
        self._closing = False  # `close` began: a write the closed store refuses is no fault
        self._late_write_logged = False  # the first such write is logged, no more
        self._serving = serving
        self._store: StoreBase | None = None
        self._writes: Writes | None = None
        self._pager: Pager | None = None
        self.restored_from: Restored | None = None  # set by `open`
        self._outlets = Outlets(self._holds)
        self.room = Room(core, config, lambda: self._store)
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def store(self) -> StoreBase:
        assert self._store is not None, "engine not opened"
        return self._store

    @property
    def store_open(self) -> bool:
        return self._store is not None and self._store.is_open

    # ---- lifecycle ------------------------------------------------------------------------

    def open(self, kept: KeptIndex | None = None) -> tuple[int, int]:
        """Start the audit log, open and replay the store; (messages, orphans) restored.

        `kept`: the store's index as an ha backup kept it while following, used instead of
        a scan where it matches the store; the file, which that process wrote and closed a
        moment ago, is then opened without a walk of its pages. Raises StartupError naming
        the file and the reason.
        """
        if self.audit is not None:  # audit log: started first, closed last
            try:
                self.audit.start()
            except OSError as err:
                raise StartupError(f"cannot write audit log {self.audit.dir}: {err}") from None
        core = self._core
        try:
            self.store_path.parent.mkdir(parents=True, exist_ok=True)
            reserve = self.room.reserve
            reserve.release()  # its room lets the store open on a full disk
            # A kept index comes with a file its process wrote until a moment ago.
            self._store = store = open_store(self.config, reserve.release, kept is None)
            for address, name, settings in store.load_queues():
                auto = bool(settings.pop(AUTO_CREATED, False))
                core.restore_queue(address, name, QueueConfig.model_validate(settings), auto)
            restored, orphans, self.restored_from = _restore(core, store, kept)
            forget = core.restore_ids(store.load_ids())
        except (StoreError, OSError, ValidationError) as err:
            raise StartupError(f"cannot open store {self.store_path}: {err}") from None
        self._writes = writes = Writes(store, self.config, self._groups, self.fail)
        self._pager = Pager(core, store, writes.unwritten, self._apply_plain)
        if forget:  # limits.id-cache-size was lowered: the table shrinks to what the cache holds
            writes.watch(store.write(ids=forget))
        self.room.watch_disk()
        return restored, orphans

    def start(self) -> None:
        """Run the tick (delay-before-dispatch, timers of the core), the delivery order and
        the pager."""
        assert self._pager is not None, "engine not opened"
        self._tasks = [
            asyncio.create_task(self._tick_loop(), name="tick"),
            asyncio.create_task(self._outlets.run(), name="deliver"),
            asyncio.create_task(self._pager.run(), name="page"),
        ]

    def end_streams(self, reason: str) -> None:
        self._outlets.end("UNAVAILABLE", reason)

    def end_consumers(self, consumer_ids: Collection[str], reason: str) -> None:
        """End these consumers' streams: their shells unsubscribe, what they held comes back."""
        if consumer_ids:
            self._outlets.end("UNAVAILABLE", reason, consumers=consumer_ids)

    async def close(self) -> None:
        """Stop the loops, close the store (after its queued writes) and the audit log."""
        self._closing = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._store is not None:
            await self._store.close()

    def close_audit(self) -> None:
        if self.audit is not None:
            self.audit.close()

    def fail(self, err: BaseException) -> None:
        """A fault the node cannot serve through (a store write failed): it must stop.

        Not a write that came after `close` (a stream's clean-up that runs late in a stop): it
        carried nothing acknowledged (a send not yet confirmed, a settle without its receipt,
        a delivery count), and the node is stopping anyway."""
        if self._closing and isinstance(err, StoreClosed):
            if not self._late_write_logged:
                log.info("a write came after the store closed: not applied", error=str(err))
                self._late_write_logged = True
            return
        if self.failed.done():
            return
        if isinstance(err, NotServing):  # the pair's shell warned already ("fenced"): once
            log.info("stopping: this process no longer holds its node", error=str(err))
        else:
            log.error("fatal error, stopping", error=str(err))
        self.failed.set_result(err)

    # ---- commands -------------------------------------------------------------------------

    def unit(self) -> Unit:
        """A unit of work: the commands that change the core, applied on `commit`."""
        return Unit(self._core, self._outlets, self._apply, self._consumers_changed, self.audit)

    async def create_queue(
        self, address: str, name: str, settings: QueueConfig, auto_created: bool = False
    ) -> None:
        """`auto_created`: for a client's SUBSCRIBE, so auto-delete-queues applies to it."""
        self._core.create_queue(address, name, settings, auto_created)
        for observer in self.observers:
            observer.queues_changed()
        if settings.durable:
            stored = {**_settings(settings), **({AUTO_CREATED: True} if auto_created else {})}
            await self._store_call(self.store.save_queue(address, name, stored))

    async def delete_queue(self, name: str) -> int:
        """Delete a queue and its messages; its consumers' streams end with NOT_FOUND."""
        core = self._core
        removed = core.queue(name).depth  # paged messages too: the store drops them
        core.delete_queue(name)
        self._outlets.end("NOT_FOUND", f"queue {name!r} was deleted", name)
        for observer in self.observers:
            observer.queues_changed()
            observer.queue_deleted(name)
        await self._store_call(self.store.delete_queue(name))  # its stored messages go too
        return removed

    def admit(self, addresses: Sequence[tuple[str, bool]]) -> Coroutine[Any, Any, None] | None:
        """May a client send these (address, persistent) now? See `Room.admit`."""
        return self.room.admit(addresses)

    # ---- queries --------------------------------------------------------------------------

    def queue(self, name: str) -> QueueView:
        """Raises UnknownQueue (a CoreError) if there is none."""
        return self._core.queue(name)

    def queues(self) -> list[QueueView]:
        return list(self._core.queues())

    def queues_of(self, address: str) -> list[QueueView]:
        """The queues bound to `address` on this node (none if it does not exist)."""
        return list(self._core.queues_of(address))

    def exists(self, name: str) -> bool:
        """A queue or an address of that name exists."""
        return self._core.exists(name)

    def creates(self, name: str) -> bool:
        """Whether a send or a subscription to `name` would auto-create it (Artemis:
        auto-create-addresses and auto-create-queues): the `create` permission it needs."""
        if self._core.exists(name) or name in self.config.addresses:
            return False
        rules = self.config.settings_for(name)
        return rules.auto_create_addresses and rules.auto_create_queues

    def check_address(self, address: str) -> None:
        """Raise CoreError unless a send to `address` would be routed to at least one queue."""
        self._core.check_address(address)

    def store_id(self) -> int:
        return self.store.store_id()

    def forward_marks(self) -> dict[str, int]:
        """Per origin, the highest forwarded sequence stored here (`cluster/bridge.py`)."""
        return self.store.load_marks()

    @property
    def memory(self) -> Any:
        """The node's memory meter (`broker/budget.py`): a STOMP connection counts its
        partial frames and open transactions there."""
        return self._core.budget.node

    def resources(self) -> dict[str, Any]:
        """Memory, paging, disk and blocked producers, as health reports them."""
        core = self._core
        room = self.room.resources()
        return {
            "memory_bytes": room.pop("memory_bytes"),
            "global_max_size": room.pop("global_max_size"),
            "memory_full": room.pop("memory_full"),
            "paging_queues": sorted(core.paging),
            "paged_messages": sum(core.queue(name).paged for name in core.paging),
            **room,
            "duplicate_ids": len(core.ids),
            "duplicates_dropped": core.duplicates_dropped,
        }

    # ---- applying effects -------------------------------------------------------------------

    def _holds(self) -> bool:
        """Whether the core's decisions may still take effect. Not while this process does not
        hold its node (the node fails then, NotServing), and never again once the node failed:
        the unit refused had changed the core already, so the core may hold what never
        reached the disk (a send, a duplicate id), even if the ha gate serves again before the
        stop is done."""
        if self._may_carry_out():
            return True
        self.fail(NotServing(f"{self.config.node.id} is no longer held by this process"))
        return False

    def _may_carry_out(self) -> bool:
        return not self.failed.done() and (self._serving is None or self._serving())

    def _apply(
        self, fx: Effects, receipts: list[ReceiptFor], marks: dict[str, int] | None
    ) -> Write | None:
        """Carry out a unit's Effects (see the module doc); returns its store write, if any.

        A process that no longer holds its ha node, or a node that failed, carries out
        nothing: the write fails with NotServing (clients go elsewhere), and so does the node.
        """
        if not self._holds():
            return self._refused()
        if self.audit is not None:  # audit log: queues references, formats off the loop
            self.audit.effects(fx)
        _log(fx)
        for address, name, settings in fx.queues_created:
            if settings.durable:
                stored = {**_settings(settings), AUTO_CREATED: True}  # created by a send
                self._store_call(self.store.save_queue(address, name, stored))
            for observer in self.observers:
                observer.queues_changed()
        if fx.removed:
            self.room.freed()
            self._pager.wake()  # type: ignore[union-attr]
        writes = self._writes
        assert writes is not None, "engine not opened"
        if fx.added:
            sent = sum(len(m.body) for m in fx.added if m.persistent)
            if sent:
                self.room.sent(sent)
        write, counted = writes.of(fx, marks)
        if fx.deliveries or receipts:
            gates = writes.gates(fx.deliveries)
            if counted or receipts:
                gates.add(write)
            self._outlets.push(fx.deliveries, receipts, gates)
        return None if write is None else shielded(write)

    def _apply_plain(self, fx: Effects) -> Write | None:
        return self._apply(fx, [], None)

    def _refused(self) -> Write:
        err = NotServing(f"{self.config.node.id} is stopping: {self.failed.result()}")
        refused: Write = asyncio.get_running_loop().create_future()
        refused.set_exception(err)
        refused.add_done_callback(taken)  # a caller may not wait for it
        return refused

    def _store_call(self, call: Coroutine[Any, Any, None]) -> Write:
        assert self._writes is not None, "engine not opened"
        return shielded(self._writes.watch(call))

    def _groups(self, queue: str) -> bool:
        """Whether `queue` groups its messages (store-and-forward queues do not)."""
        try:
            return self._core.queue(queue).settings.group_buckets != 0
        except CoreError:
            return False

    def _consumers_changed(self, queue: str) -> None:
        for observer in self.observers:
            observer.consumers_changed(queue)

    # ---- timers ---------------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        sweep_at = 0.0
        core = self._core
        while True:
            await asyncio.sleep(TICK_S)
            self._apply_plain(core.tick(now_ns()))
            self.room.watch_disk()
            if time.monotonic() >= sweep_at:
                sweep_at = time.monotonic() + SWEEP_S
                self._pager.wake()  # type: ignore[union-attr]
                await self._delete_idle_queues()

    async def _delete_idle_queues(self) -> None:
        """auto-delete-queues: auto-created queues left empty and unused go."""
        core = self._core
        for name in core.idle_queues(now_ns()):
            if core.is_idle(name):  # still: a send may have come during the last delete
                log.info("auto-created queue deleted: empty and unused", queue=name)
                await self.delete_queue(name)


def _log(fx: Effects) -> None:
    """What an operator must hear of a core call: stalls, drops, paging."""
    for queue, name, unacked, ns in fx.stalled:
        log.warning(
            "consumer stalls: new groups go to other consumers",
            queue=queue,
            consumer=name,
            unacked=unacked,
            seconds_without_settle=round(ns / 1e9, 1),
        )
    for m, why in fx.dropped:
        log.warning("dead message dropped", queue=m.queue, msg_id=m.msg_id, reason=why)
    for address, dup_id, original in fx.duplicates:
        log.debug(
            "duplicate dropped", address=address, duplicate_id=dup_id, original_msg_id=original
        )
    for queue, started in fx.paging:
        if started:
            log.warning("queue pages: its address is full, new messages stay on disk", queue=queue)
        else:
            log.info("queue read its page back: all its messages are in memory", queue=queue)


def _restore(
    core: BrokerCore, store: StoreBase, kept: KeptIndex | None
) -> tuple[int, int, Restored]:
    """The store's messages into the core: by their index where the store reads one (grouped
    messages stay paged until they can be delivered), the `kept` one if it holds as many
    messages as the store, else whole; (restored, orphans, which way)."""
    next_id = store.max_msg_id() + 1
    index, how = None, "store index"
    if kept is not None:  # an ha backup's: its store is SQLite (`_ha_replicates_sqlite`)
        stored = store.message_count()
        if len(kept) == stored:
            index, how = kept.runs(), "kept index"
        else:  # a fault on the backup's side: the store is the truth
            log.warning(
                "the index kept while following does not match the store: scanning the store",
                kept=len(kept),
                stored=stored,
            )
    if index is None:
        index = store.index()
    if index is None:
        return (*core.restore_messages(store.messages(), next_id), "whole messages")
    restored, orphans, ungrouped = core.restore_index(index, next_id)
    for queue, msg_ids in ungrouped.items():
        [messages] = store.read_ids(queue, [msg_ids])
        restored += core.restore_messages(messages, next_id)[0]
    return restored, orphans, how
