"""The engine: the asyncio shell around one node's pure core and its store.

The engine is the only writer of `BrokerCore`; every call happens on the event loop thread.
Each core call returns `Effects`, which `apply` carries out: the store write starts at once,
and deliveries reach consumer streams strictly in the order the core produced them, never
before the messages they carry are on disk (each waits for the write that adds its own
message). Protocol shells and the cluster drive the engine; it knows neither of them: what
the layers above must hear about (queues created or deleted, consumers coming and going) goes
to the `Observer`s they register.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from broker import disk, logs
from broker.audit import node_audit
from broker.budget import footprint
from broker.clock import now_ns
from broker.config import NodeConfig, QueueConfig
from broker.core import AddressFull, BrokerCore, CoreError
from broker.effects import Delivery, Effects
from broker.message import Message
from broker.store import Store, StoreError

TICK_S = 0.05
PAGE_READ = 1000  # paged messages of one group read back at once, at most
PAGE_GROUPS = 200  # groups read back at once, at most (one store read)
PAGE_GUESS_BYTES = 2048  # a paged message's footprint before any has been read
DISK_POLL_BYTES = 1 << 20  # the data volume is looked at again after this many bytes sent
GIVEBACK_S = 1.0  # at most this often, a tight disk gets the store's free pages back
SWEEP_S = 1.0  # how often idle auto-created queues are looked for
AUTO_CREATED = "pinmq-auto-created"  # marks a stored queue definition as auto-created
STORE_FILE = "store.db"
log = logs.get("node")


class NotServing(Exception):
    """This process stopped holding its logical node (an ha pair member that lost its
    quorum): nothing more is carried out, and the node stops."""


class StartupError(Exception):
    """The node cannot start; the message names what (file, address) and why."""


@dataclass(slots=True)
class Receipt:
    """Settled delivery ids, to be confirmed to the consumer once their outcome is stored."""

    delivery_ids: list[int]


@dataclass(slots=True, eq=False)
class ConsumerStream:
    """One subscribed consumer as the shells see it: its outbound queue and its end.

    `outbound` holds lists of deliveries and receipts in the order they must be sent; the
    transport drains it. `ended` completes (with a status code name and a reason) when the
    node ends the subscription, e.g. because its queue was deleted.
    """

    consumer_id: str
    queue: str
    outbound: asyncio.Queue[list[Delivery] | Receipt] = field(default_factory=asyncio.Queue)
    ended: asyncio.Future[tuple[str, str]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    owed: int = 0  # receipts for settles already applied, not yet in `outbound`
    writing: bool = False  # the transport took items from `outbound` and is sending them

    def end(self, code: str, reason: str) -> None:
        if not self.ended.done():
            self.ended.set_result((code, reason))


class Observer(Protocol):
    """What a layer above the engine hears about (the cluster announces it to its peers)."""

    def queues_changed(self) -> None: ...

    def consumers_changed(self, queue: str) -> None: ...

    def queue_deleted(self, queue: str) -> None: ...


@dataclass(slots=True)
class _Step:
    """Deliveries (and a receipt) waiting for store writes before they may go out."""

    gates: list[asyncio.Future[None]]
    deliveries: list[Delivery]
    receipt: tuple[ConsumerStream, Receipt] | None


def _settings(settings: QueueConfig) -> dict[str, object]:
    return settings.model_dump(mode="json", by_alias=True)


class Engine:
    """Core + store + consumer streams + the tick; `open` it, then `start` its loops."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.core = BrokerCore(config)
        self.streams: dict[str, ConsumerStream] = {}
        self.store_path = Path(config.node.data_dir) / STORE_FILE
        self.observers: list[Observer] = []
        self.audit = node_audit(config)  # audit log (broker/audit.py); None unless enabled
        self.failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        self._store: Store | None = None
        self._backlog: deque[_Step] = deque()
        self._backlog_ready = asyncio.Event()
        self._unwritten: dict[int, asyncio.Future[None]] = {}  # msg id -> write that adds it
        self._tasks: list[asyncio.Task[None]] = []
        data_dir = Path(config.node.data_dir)
        self.reserve = disk.Reserve(data_dir, config.limits.disk_reserve)
        self._sent_bytes = 0  # persistent bytes sent since the data volume was last looked at
        self._next_giveback = 0.0  # when the store may next be asked to give space back
        self._room = asyncio.Event()  # set when memory frees while queues page
        self._space = asyncio.Event()  # replaced once set: wakes producers blocked (BLOCK)
        self.blocked = 0  # producers waiting for room
        # An ha pair's active process: whether it still holds its node (`PairShell.may_serve`).
        self.serving: Callable[[], bool] | None = None

    @property
    def store(self) -> Store:
        assert self._store is not None, "engine not opened"
        return self._store

    @property
    def store_open(self) -> bool:
        return self._store is not None and self._store.is_open

    # ---- lifecycle ------------------------------------------------------------------------

    def open(self) -> tuple[int, int]:
        """Start the audit log, open and replay the store; (messages, orphans) restored.

        Raises StartupError naming the file and the reason.
        """
        if self.audit is not None:  # audit log: started first, closed last
            try:
                self.audit.start()
            except OSError as err:
                raise StartupError(f"cannot write audit log {self.audit.dir}: {err}") from None
        try:
            self.store_path.parent.mkdir(parents=True, exist_ok=True)
            self.reserve.release()  # its room lets the store open on a full disk
            self._store = store = Store.open(self.store_path, on_full=self.reserve.release)
            for address, name, settings in store.load_queues():
                auto = bool(settings.pop(AUTO_CREATED, False))
                self.core.restore_queue(address, name, QueueConfig.model_validate(settings), auto)
            restored, orphans = self.core.restore_messages(store.messages(), store.max_msg_id() + 1)
            forget = self.core.restore_ids(store.load_ids())
        except (StoreError, OSError, ValidationError) as err:
            raise StartupError(f"cannot open store {self.store_path}: {err}") from None
        if forget:  # limits.id-cache-size was lowered: the table shrinks to what the cache holds
            self._watch(store.write(ids=forget))
        self._watch_disk()
        return restored, orphans

    def start(self) -> None:
        """Run the tick (delay-before-dispatch, timers of the core) and the delivery order."""
        self._tasks = [
            asyncio.create_task(self._tick_loop(), name="tick"),
            asyncio.create_task(self._backlog_loop(), name="deliver"),
            asyncio.create_task(self._page_loop(), name="page"),
        ]
        self._room.set()  # queues restored paged may have room already

    def end_streams(self, reason: str) -> None:
        for stream in list(self.streams.values()):
            stream.end("UNAVAILABLE", reason)

    async def close(self) -> None:
        """Stop the loops, close the store (after its queued writes) and the audit log."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._store is not None:
            await self._store.close()

    def close_audit(self) -> None:
        if self.audit is not None:
            self.audit.close()

    def fail(self, err: BaseException) -> None:
        """A fault the node cannot serve through (a store write failed): it must stop."""
        if not self.failed.done():
            log.error("fatal error, stopping", error=str(err))
            self.failed.set_result(err)

    # ---- effects --------------------------------------------------------------------------

    def apply(
        self,
        fx: Effects,
        receipt: tuple[ConsumerStream, Receipt] | None = None,
        marks: Mapping[str, int] | None = None,
    ) -> asyncio.Future[None] | None:
        """Carry out what a core call asked for; returns its store write, if there is one.

        Await the returned future before confirming the operation to a client. `marks`
        (forwarded messages, `cluster/bridge.py`) are stored in the same write as the messages.
        A process that no longer holds its ha node carries out nothing: the write fails with
        NotServing, and so does the node.
        """
        if self.serving is not None and not self.serving():
            return self._fenced()
        if self.audit is not None:  # audit log: queues references, formats off the loop
            self.audit.effects(fx)
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
                log.warning(
                    "queue pages: its address is full, new messages stay on disk", queue=queue
                )
            else:
                log.info("queue read its page back: all its messages are in memory", queue=queue)
        for address, name, settings in fx.queues_created:
            if settings.durable:
                stored = {**_settings(settings), AUTO_CREATED: True}  # created by a send
                self._watch(self.store.save_queue(address, name, stored))
            for observer in self.observers:
                observer.queues_changed()
        added = [m for m in fx.added if m.persistent]
        if fx.removed:
            self._freed()
        if added:
            self._sent_bytes += sum(len(m.body) for m in added)
            if self._sent_bytes >= DISK_POLL_BYTES:
                self._watch_disk()
        removed = [m for m in fx.removed if m.persistent]
        updated = [m for m in fx.updated if m.persistent]
        counted = self._counted(fx.deliveries)
        ids = fx.duplicate_ids
        write = None
        if added or removed or updated or marks or counted or ids:
            write = self._watch(
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
        if not fx.deliveries and receipt is None:
            return write
        # A delivery waits for the write that adds its own message (from any earlier send), and
        # for the one that counts it, if any.
        unwritten = self._unwritten
        waits = {unwritten.get(d.message.msg_id) for d in fx.deliveries} if unwritten else set()
        if receipt is not None:
            receipt[0].owed += 1
            waits.add(write)
        if counted:
            waits.add(write)
        gates = [f for f in waits if f is not None and not f.done()]
        if not gates and not self._backlog:
            self._push(fx.deliveries, receipt)
        else:
            self._backlog.append(_Step(gates, fx.deliveries, receipt))
            self._backlog_ready.set()
        return write

    def _with_originals(
        self, duplicates: Sequence[tuple[str, str, int]], write: asyncio.Future[None] | None
    ) -> asyncio.Future[None] | None:
        """`write`, and the writes of the dropped duplicates' originals still under way: a
        duplicate is confirmed only once the message it stands for is on disk."""
        unwritten = self._unwritten
        gates = {unwritten.get(original) for _, _, original in duplicates} if unwritten else set()
        gates.add(write)
        pending = [f for f in gates if f is not None and not f.done()]
        if len(pending) <= 1:
            return pending[0] if pending else write
        return asyncio.ensure_future(_all(pending))

    def _counted(self, deliveries: Sequence[Delivery]) -> list[Message]:
        """The delivered messages whose count is stored before they go out
        (`persist-delivery-count-before-delivery`)."""
        which = self.config.persist_delivery_count_before_delivery
        if which == "none" or not deliveries:
            return []
        if which == "all":
            return [d.message for d in deliveries if d.message.persistent]
        grouping: dict[str, bool] = {}  # queue -> it groups (store-and-forward queues do not)
        counted = []
        for d in deliveries:
            m = d.message
            if not m.persistent or m.group is None:
                continue
            if m.queue not in grouping:
                grouping[m.queue] = self._groups(m.queue)
            if grouping[m.queue]:
                counted.append(m)
        return counted

    def _groups(self, queue: str) -> bool:
        try:
            return self.core.queue(queue).settings.group_buckets != 0
        except CoreError:
            return False

    def _track(self, added: list[Message], write: asyncio.Future[None]) -> None:
        """Remember which write makes each added message durable, until it has."""
        unwritten = self._unwritten
        for m in added:
            unwritten[m.msg_id] = write

        def written(_: asyncio.Future[None]) -> None:
            for m in added:
                if unwritten.get(m.msg_id) is write:
                    del unwritten[m.msg_id]

        write.add_done_callback(written)

    def _watch(self, write: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        """Start a store call now (it joins the next group commit); its failure is fatal."""
        future = asyncio.ensure_future(write)
        future.add_done_callback(self._check_write)
        return future

    def _fenced(self) -> asyncio.Future[None]:
        err = NotServing(f"{self.config.node.id} is no longer held by this process")
        self.fail(err)
        refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        refused.set_exception(err)
        refused.add_done_callback(lambda f: f.exception())  # a caller may not wait for it
        return refused

    def _check_write(self, future: asyncio.Future[None]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.fail(future.exception())  # type: ignore[arg-type]

    def _push(
        self, deliveries: list[Delivery], receipt: tuple[ConsumerStream, Receipt] | None
    ) -> None:
        if self.serving is not None and not self.serving():
            self._fenced()  # decided while it held the node, but not sent before it lost it
            return
        streams = self.streams
        if deliveries:
            first = deliveries[0].consumer_id
            if all(d.consumer_id == first for d in deliveries):
                if (stream := streams.get(first)) is not None:
                    stream.outbound.put_nowait(deliveries)
            else:
                per: dict[str, list[Delivery]] = {}
                for d in deliveries:
                    per.setdefault(d.consumer_id, []).append(d)
                for consumer_id, batch in per.items():
                    if (stream := streams.get(consumer_id)) is not None:
                        stream.outbound.put_nowait(batch)
        # A consumer that is gone had its deliveries returned to the queue by close_consumer.
        if receipt is not None:
            receipt[0].owed -= 1
            if receipt[0].consumer_id in streams:
                receipt[0].outbound.put_nowait(receipt[1])

    async def _backlog_loop(self) -> None:
        backlog = self._backlog
        while True:
            await self._backlog_ready.wait()
            self._backlog_ready.clear()
            while backlog:
                step = backlog[0]
                for gate in step.gates:
                    try:
                        await gate
                    except Exception:
                        return  # the node fails: nothing more goes out
                backlog.popleft()
                self._push(step.deliveries, step.receipt)

    # ---- room: memory, paging and the data volume ----------------------------------------------

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
            self.core.admit(address, persistent)

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
            while self.core.budget.node.full:
                await self._space.wait()
        finally:
            self._unblock()

    def _freed(self) -> None:
        """Messages left memory: blocked producers look again, paged queues may read back."""
        self._wake_blocked()
        if self.core.paging:
            self._room.set()

    def resources(self) -> dict[str, Any]:
        """Memory, paging, disk and blocked producers, as health reports them."""
        core, budget = self.core, self.core.budget
        store = self._store
        return {
            "memory_bytes": budget.node.bytes,
            "global_max_size": budget.node.limit,
            "memory_full": budget.node.full,
            "paging_queues": sorted(core.paging),
            "paged_messages": sum(core.queue(name).paged for name in core.paging),
            "blocked_producers": self.blocked,
            "disk_percent": round(budget.disk_percent, 1),
            "max_disk_usage": self.config.limits.max_disk_usage,
            "disk_full": budget.disk_full,
            "disk_reserve_held": self.reserve.held,
            "store_waits_for_space": store is not None and store.waiting_for_space,
            "duplicate_ids": len(core.ids),
            "duplicates_dropped": core.duplicates_dropped,
        }

    def _wake_blocked(self) -> None:
        if self.blocked:
            self._space.set()
            self._space = asyncio.Event()

    def _watch_disk(self) -> None:
        """Look at the data volume: refuse persistent sends above max-disk-usage, and keep
        the reserve while there is room for it."""
        self._sent_bytes = 0
        limit = self.config.limits.max_disk_usage
        budget = self.core.budget
        try:
            usage = disk.usage(self.store_path.parent)
        except OSError as err:
            log.warning("cannot read the data volume's usage", error=str(err))
            return
        if self._store is not None:  # the store's free pages take new messages first
            free_pages = min(usage.used, self._store.free_bytes)
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
                self._wake_blocked()
        reserve, store = self.reserve, self._store
        if not (full or reserve.held or not reserve.size) and reserve.take():
            log.info("disk reserve taken", bytes=reserve.size)
        tight = full or (reserve.size and not reserve.held)
        now = time.monotonic()
        if tight and store is not None and store.free_bytes and now >= self._next_giveback:
            self._next_giveback = now + GIVEBACK_S
            store.give_back_space()

    async def _page_loop(self) -> None:
        """Read paged groups back, oldest first, while their address has room: the groups
        that can be delivered now (`Queue.wanted`), so a group whose consumer is stuck
        never holds the others back."""
        core = self.core
        average = PAGE_GUESS_BYTES  # a paged message's footprint, from the last read
        while True:
            await self._room.wait()
            self._room.clear()
            for name in list(core.paging):
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
                        try:
                            await tail
                        except Exception:
                            return  # the node fails
                        continue
                    ids = [msg_ids for _, msg_ids in wanted]
                    pages = await asyncio.to_thread(self.store.read_ids, name, ids)
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
                    self.apply(fx)

    async def _tick_loop(self) -> None:
        sweep_at = 0.0
        while True:
            await asyncio.sleep(TICK_S)
            self.apply(self.core.tick(now_ns()))
            self._watch_disk()
            if time.monotonic() >= sweep_at:
                sweep_at = time.monotonic() + SWEEP_S
                if self.core.paging:  # a consumer that came, or got credit, may want a page
                    self._room.set()
                await self._delete_idle_queues()

    async def _delete_idle_queues(self) -> None:
        """auto-delete-queues: auto-created queues left empty and unused go."""
        for name in self.core.idle_queues(now_ns()):
            if self.core.is_idle(name):  # still: a send may have come during the last delete
                log.info("auto-created queue deleted: empty and unused", queue=name)
                await self.delete_queue(name)

    # ---- consumers and queues ----------------------------------------------------------------

    def end_consumers(self, queue: str, code: str, reason: str) -> None:
        for stream in list(self.streams.values()):
            if stream.queue == queue:
                stream.end(code, reason)

    async def create_queue(
        self, address: str, name: str, settings: QueueConfig, auto_created: bool = False
    ) -> None:
        """`auto_created`: for a client's SUBSCRIBE, so auto-delete-queues applies to it."""
        self.core.create_queue(address, name, settings, auto_created)
        for observer in self.observers:
            observer.queues_changed()
        if settings.durable:
            stored = {**_settings(settings), **({AUTO_CREATED: True} if auto_created else {})}
            await self._watch(self.store.save_queue(address, name, stored))

    async def delete_queue(self, name: str) -> int:
        """Delete a queue and its messages; its consumers' streams end with NOT_FOUND."""
        removed = self.core.queue(name).depth  # paged messages too: the store drops them
        self.core.delete_queue(name)
        self.end_consumers(name, "NOT_FOUND", f"queue {name!r} was deleted")
        for observer in self.observers:
            observer.queues_changed()
            observer.queue_deleted(name)
        await self._watch(self.store.delete_queue(name))  # drops its stored messages too
        return removed

    def consumers_changed(self, queue: str) -> None:
        """A consumer subscribed to or left `queue` (the shells call this)."""
        for observer in self.observers:
            observer.consumers_changed(queue)


async def _all(writes: Sequence[asyncio.Future[None]]) -> None:
    """Wait for every write; the first failure is raised (the node fails with it anyway)."""
    for write in writes:
        await write
