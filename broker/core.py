"""All addresses and queues of one node: routing, auto-creation and dead-lettering (pure).

The node shell is the only caller and calls from one thread; every operation returns the
`Effects` the shells must carry out (persist before acknowledging, then deliver).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from broker.addresses import Address, RoutingType
from broker.budget import Budget, Refusal
from broker.config import NodeConfig, QueueConfig
from broker.duplicates import Change, IdCache
from broker.effects import Effects
from broker.grouping import group_key
from broker.message import DUPLICATE_ID_HEADER, Message, Outgoing
from broker.queue import NoSuchGroup, Queue, QueueError
from broker.restoring import Restoring
from broker.validation import InvalidInput, check_name

ORIGINAL_ADDRESS_HEADER = "_AMQ_ORIG_ADDRESS"
ORIGINAL_QUEUE_HEADER = "_AMQ_ORIG_QUEUE"


class CoreError(Exception):
    """A request refused by the core; `code` maps to a gRPC status in the shell."""

    code = "invalid_argument"


class InvalidRequest(CoreError):
    code = "invalid_argument"


class UnknownQueue(CoreError):
    code = "not_found"


class UnknownAddress(CoreError):
    code = "not_found"


class QueueExists(CoreError):
    code = "already_exists"


class TooManyQueues(CoreError):
    code = "resource_exhausted"


class UnknownGroup(CoreError):
    code = "not_found"


class AddressFull(CoreError):
    """A send refused for want of memory or disk (`Budget.refusal`); `block`: it may wait."""

    code = "resource_exhausted"

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.reason)
        self.block = refusal.block


class BrokerCore(Restoring):
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self._addresses: dict[str, Address] = {}
        self._queues: dict[str, Queue] = {}
        self._visible = 0  # queues counted against limits.max-queues (not internal `$` ones)
        self._idle_since: dict[str, int] = {}  # auto-created queue -> found idle since (ns)
        self._next_id = 1
        self.budget = Budget(config)
        self.paging: set[str] = set()  # queues with paged messages
        self.ids = IdCache(config.limits.id_cache_size)  # duplicate detection, per address
        self.duplicates_dropped = 0  # a client's messages dropped as duplicates, since start
        for name, address in config.addresses.items():
            self._address(name, address.routing_type)
            for queue_name, settings in address.queues.items():
                self._add_queue(name, queue_name, settings, restoring=True)

    # ---- queues -----------------------------------------------------------------------

    def queue(self, name: str) -> Queue:
        q = self._queues.get(name)
        if q is None:
            raise UnknownQueue(f"no queue named {name!r}")
        return q

    def queues(self) -> list[Queue]:
        return list(self._queues.values())

    def create_queue(
        self, address: str, name: str, settings: QueueConfig, auto_created: bool = False
    ) -> None:
        """`auto_created`: on a client's SUBSCRIBE (auto-delete-queues applies to it)."""
        _check_name(address, "address")
        _check_name(name, "queue name")
        if name in self._queues:
            raise QueueExists(f"queue {name!r} already exists")
        self._add_queue(address, name, settings, auto_created)

    def delete_queue(self, name: str) -> Effects:
        q = self.queue(name)
        fx = Effects(removed=q.held())
        q.forget()
        del self._queues[name]
        self.paging.discard(name)
        self._visible -= not name.startswith("$")
        self._idle_since.pop(name, None)
        a = self._addresses[q.address]
        a.remove(name)
        if not a.queues and a.name not in self.config.addresses:
            del self._addresses[a.name]  # auto-created: the next send creates it again
            self.budget.forget(a.name)
        return fx

    def restore_queue(
        self, address: str, name: str, settings: QueueConfig, auto_created: bool = False
    ) -> None:
        """A queue recorded in the store; the config's own definition wins."""
        if name not in self._queues:
            self._add_queue(address, name, settings, auto_created, restoring=True)

    # ---- messages ---------------------------------------------------------------------

    def check_address(self, address: str) -> None:
        """Raise unless a send to `address` would be routed to at least one queue."""
        if not address:
            raise InvalidRequest("address must not be empty")
        a = self._addresses.get(address)
        if a is not None:
            if not a.queues:
                raise UnknownAddress(f"address {address!r} has no queue to hold the message")
            return
        _check_name(address, "address")  # it would be created
        rules = self.config.settings_for(address)
        if not (rules.auto_create_addresses and rules.auto_create_queues):
            raise UnknownAddress(
                f"address {address!r} does not exist and address-settings forbid auto-creating it"
            )

    def send(self, m: Outgoing, now_ns: int) -> tuple[int, Effects]:
        """Route a client's message by its address: to its queues, auto-created if allowed."""
        self.check_address(m.address)
        fx = Effects()
        a = self._addresses.get(m.address) or self._auto_create(m.address, fx)
        msg_id = self._route(a, m, now_ns, fx)
        self._dead_letter(now_ns, fx)
        return msg_id, fx

    def deliver_to(self, queue: str, m: Outgoing, now_ns: int) -> tuple[int | None, Effects]:
        """Enqueue into one named queue, bypassing address routing (forwarded messages).

        Another node already chose `queue` as the target, so only that queue may take the
        message. A missing queue is created on the message's address per address-settings;
        where those forbid it, the message goes to the address-settings dead-letter address,
        or is dropped (msg id None) when there is none: it must not wait, or the sender's
        queue would stall.
        """
        fx = Effects()
        address = m.address
        q = self._queues.get(queue)
        if q is None:
            rules = self.config.settings_for(address)
            _check_name(address, "address")
            _check_name(queue, "queue name")
            if not (rules.auto_create_queues and rules.auto_create_addresses):
                return self._no_route(queue, m, now_ns, fx)
            settings = rules.queue_config()
            q = self._add_queue(address, queue, settings, auto_created=True)
            fx.queues_created.append((address, queue, settings))
        msg_id = self._next_id
        self._next_id += 1
        message = Message(
            msg_id=msg_id,
            queue=queue,
            address=address,
            body=m.body,
            headers=m.headers,
            persistent=m.persistent and q.settings.durable,
            enqueued_ns=now_ns,
            delivery_count=m.delivery_count,
        )
        fx.added.append(message)
        self._place(q, message, now_ns, fx)
        self._dead_letter(now_ns, fx)
        return msg_id, fx

    # ---- duplicate detection (`_AMQ_DUPL_ID`, broker/duplicates.py) ---------------------------

    def duplicates(self, batch: Sequence[Outgoing]) -> list[bool]:
        """Which messages of a client's batch to drop: their id was accepted on their address
        lately, or an earlier message of the batch carries it. Changes nothing."""
        return self.ids.screen([(m.address, m.headers.get(DUPLICATE_ID_HEADER)) for m in batch])

    def accepted(self, m: Outgoing, msg_id: int, fx: Effects) -> None:
        """A client's message was routed (`msg_id`: its first copy's): its id, if it has one,
        is remembered, and for a persistent message stored with it (`fx.duplicate_ids`)."""
        dup_id = m.headers.get(DUPLICATE_ID_HEADER)
        if dup_id:
            fx.duplicate_ids += self.ids.add(m.address, dup_id, msg_id, m.persistent)

    def dropped(self, m: Outgoing, fx: Effects) -> int:
        """A duplicate dropped (counted, reported in `fx.duplicates`): the msg id the sender
        is given, the original's while the cache holds it, else 0."""
        dup_id = m.headers.get(DUPLICATE_ID_HEADER, "")
        original = self.ids.original(m.address, dup_id) or 0
        self.duplicates_dropped += 1
        fx.duplicates.append((m.address, dup_id, original))
        return original

    def restore_ids(self, entries: Iterable[tuple[str, str, int]]) -> list[Change]:
        """Stored ids (address, id, msg id), oldest first; returns the forgetting of those that
        no longer fit `limits.id-cache-size`, for the store."""
        return self.ids.load(entries)

    def exists(self, name: str) -> bool:
        """A queue or an address of that name exists (a dict lookup each, whatever the count)."""
        return name in self._queues or name in self._addresses

    def queues_of(self, address: str) -> list[Queue]:
        """The queues bound to `address` on this node (none if it does not exist)."""
        a = self._addresses.get(address)
        return [self._queues[name] for name in a.queues] if a is not None else []

    def ensure_internal_queue(self, name: str, settings: QueueConfig) -> Effects:
        """An internal queue (address = its name), created if missing; the Effects persist it."""
        fx = Effects()
        if name not in self._queues:
            self._add_queue(name, name, settings)
            fx.queues_created.append((name, name, settings))
        return fx

    def _no_route(
        self, queue: str, m: Outgoing, now_ns: int, fx: Effects
    ) -> tuple[int | None, Effects]:
        address = m.address
        dla = self.config.settings_for(address).dead_letter_address
        if not dla or dla == address:
            return None, fx
        try:
            self.check_address(dla)
        except UnknownAddress:
            return None, fx
        a = self._addresses.get(dla) or self._auto_create(dla, fx)
        headers = {**m.headers, ORIGINAL_ADDRESS_HEADER: address, ORIGINAL_QUEUE_HEADER: queue}
        dead = Outgoing(dla, m.body, headers, m.persistent)
        return self._route(a, dead, now_ns, fx), fx

    def subscribe(
        self, queue: str, consumer_id: str, name: str, prefetch: int, now_ns: int
    ) -> Effects:
        """A new consumer; its prefetch is cut to `limits.max-prefetch`."""
        prefetch = min(prefetch, self.config.limits.max_prefetch)
        return self._on_queue(
            queue, lambda q, fx: q.subscribe(consumer_id, name, prefetch, now_ns, fx), now_ns
        )

    def close_consumer(self, queue: str, consumer_id: str, now_ns: int) -> Effects:
        if queue not in self._queues:
            return Effects()  # the queue was deleted under its consumers
        return self._on_queue(
            queue, lambda q, fx: q.close_consumer(consumer_id, now_ns, fx), now_ns
        )

    def ack(self, queue: str, consumer_id: str, ids: Sequence[int], now_ns: int) -> Effects:
        return self._on_queue(queue, lambda q, fx: q.ack(consumer_id, ids, now_ns, fx), now_ns)

    def release(self, queue: str, consumer_id: str, ids: Sequence[int], now_ns: int) -> Effects:
        return self._on_queue(queue, lambda q, fx: q.release(consumer_id, ids, now_ns, fx), now_ns)

    def reject(self, queue: str, consumer_id: str, ids: Sequence[int], now_ns: int) -> Effects:
        return self._on_queue(queue, lambda q, fx: q.reject(consumer_id, ids, now_ns, fx), now_ns)

    def reset_groups(self, queue: str, group: str | None, now_ns: int) -> Effects:
        return self._on_queue(queue, lambda q, fx: q.reset_groups(group, now_ns, fx), now_ns)

    def take_ungrouped(self, queue: str) -> tuple[list[Message], Effects]:
        """Take a queue's pending ungrouped messages out (see `Queue.take_ungrouped`)."""
        fx = Effects()
        return self.queue(queue).take_ungrouped(fx), fx

    def hold_group(self, queue: str, group: str) -> None:
        """Deliver nothing more of a group until `unhold_group` (see `Queue.hold`)."""
        self.queue(queue).hold(group)

    def unhold_group(self, queue: str, group: str, now_ns: int) -> Effects:
        return self._on_queue(queue, lambda q, fx: q.unhold(group, now_ns, fx), now_ns)

    def take_group(self, queue: str, group: str) -> tuple[list[Message], Effects]:
        """Take a held group's waiting messages out (see `Queue.take_group`)."""
        fx = Effects()
        try:
            return self.queue(queue).take_group(group, fx), fx
        except QueueError as err:
            raise InvalidRequest(str(err)) from None

    def admit(self, address: str, persistent: bool) -> None:
        """Raise AddressFull if a client's send to `address` may not go in now (memory, disk);
        a message that will be paged goes in. Forwarded messages are never refused."""
        pageable = all(q.settings.durable for q in self.queues_of(address))
        refusal = self.budget.refusal(address, persistent, pageable)
        if refusal is not None:
            raise AddressFull(refusal)

    def page_in(
        self,
        queue: str,
        group: str | None,
        msg_ids: Sequence[int],
        messages: Sequence[Message],
        now_ns: int,
    ) -> Effects:
        """Paged messages read back from the store (`Queue.unpage`), if the group still
        expects exactly these; a read that raced a deletion or another read is dropped."""
        fx = Effects()
        q = self._queues.get(queue)
        if q is None or not q.unpage(group, msg_ids, messages, now_ns, fx):
            return fx
        if not q.paged:
            self.paging.discard(queue)
            fx.paging.append((queue, False))
        self._dead_letter(now_ns, fx)
        return fx

    def tick(self, now_ns: int) -> Effects:
        fx = Effects()
        for q in self._queues.values():
            q.tick(now_ns, fx)
        return fx

    # ---- internals --------------------------------------------------------------------

    def _on_queue(self, name: str, op, now_ns: int) -> Effects:  # type: ignore[no-untyped-def]
        q = self.queue(name)
        fx = Effects()
        try:
            op(q, fx)
        except NoSuchGroup as err:
            raise UnknownGroup(str(err)) from None
        except QueueError as err:
            raise InvalidRequest(str(err)) from None
        self._dead_letter(now_ns, fx)
        return fx

    def _address(self, name: str, routing_type: RoutingType) -> Address:
        a = self._addresses.get(name)
        if a is None:
            a = self._addresses[name] = Address(name, routing_type)
        return a

    def _add_queue(
        self,
        address: str,
        name: str,
        settings: QueueConfig,
        auto_created: bool = False,
        restoring: bool = False,
    ) -> Queue:
        limit = self.config.limits.max_queues
        if not restoring and not name.startswith("$") and self._visible >= limit:
            raise TooManyQueues(
                f"cannot create queue {name!r}: the node holds {limit} queues (limits.max-queues)"
            )
        q = self._queues[name] = Queue(name, address, settings, self.budget.meter(address))
        if auto_created:
            rules = self.config.settings_for(address)
            if rules.auto_delete_queues:
                q.idle_limit_ns = rules.auto_delete_queues_delay * 1_000_000
        self._visible += not name.startswith("$")
        self._address(address, "anycast").queues.append(name)
        return q

    def idle_queues(self, now_ns: int) -> list[str]:
        """Auto-created queues empty and without consumers for their auto-delete-queues-delay.

        A queue's idle time is counted from the first call that finds it idle; call this
        every second or so (it looks at every queue).
        """
        idle, since = [], self._idle_since
        for name, q in self._queues.items():
            limit = q.idle_limit_ns
            if limit is None or q.depth or q.consumer_count:
                since.pop(name, None)
            elif now_ns - since.setdefault(name, now_ns) >= limit:
                idle.append(name)
        return idle

    def is_idle(self, name: str) -> bool:
        q = self._queues.get(name)
        if q is None or q.idle_limit_ns is None:
            return False
        return not q.depth and not q.consumer_count

    def _auto_create(self, address: str, fx: Effects) -> Address:
        settings = self.config.queue_config_for(address)
        self._add_queue(address, address, settings, auto_created=True)
        fx.queues_created.append((address, address, settings))
        return self._addresses[address]

    def _route(self, a: Address, m: Outgoing, now_ns: int, fx: Effects) -> int:
        msg_id = self._next_id
        self._next_id += 1
        queues, key = a.queues, None
        if a.routing_type == "anycast" and len(queues) > 1:  # the group's queue, if pinned
            key = group_key(self._queues[queues[0]].settings, m.headers)
        for name in a.targets(key):
            q = self._queues[name]
            message = Message(
                msg_id=msg_id,
                queue=name,
                address=a.name,
                body=m.body,
                headers=m.headers,
                persistent=m.persistent and q.settings.durable,
                enqueued_ns=now_ns,
            )
            fx.added.append(message)
            self._place(q, message, now_ns, fx)
        return msg_id

    def _place(self, q: Queue, m: Message, now_ns: int, fx: Effects) -> None:
        """Into memory, or, when its address is full under PAGE, onto its group's page (on
        disk only, `Queue.enqueue`); a group that pages keeps paging until read back."""
        meter = q.meter
        full = m.persistent and q.settings.durable and meter.policy == "PAGE" and meter.full
        if q.enqueue(m, now_ns, fx, full) and q.name not in self.paging:
            self.paging.add(q.name)
            fx.paging.append((q.name, True))

    def _dead_letter(self, now_ns: int, fx: Effects) -> None:
        """Move dead messages to their queue's dead-letter address, or drop them."""
        for m in fx.dead:
            fx.removed.append(m)
            dla = (
                self._queues[m.queue].settings.dead_letter_address
                if m.queue in self._queues
                else None
            )
            if not dla:
                continue  # dead-letter-address null: dropped on purpose
            if dla == m.address:
                fx.dropped.append((m, f"rejected on its own dead-letter address {dla!r}"))
                continue
            try:
                self.check_address(dla)
                a = self._addresses.get(dla) or self._auto_create(dla, fx)
            except (UnknownAddress, TooManyQueues) as err:
                fx.dropped.append((m, f"dead-letter address unusable: {err}"))
                continue
            headers = {
                **m.headers,
                ORIGINAL_ADDRESS_HEADER: m.address,
                ORIGINAL_QUEUE_HEADER: m.queue,
            }
            self._route(a, Outgoing(dla, m.body, headers, m.persistent), now_ns, fx)


def _check_name(name: str, what: str) -> None:
    try:
        check_name(name, what)
    except InvalidInput as err:
        raise InvalidRequest(str(err)) from None
