"""`Client`: a connection to a node (one of its addresses), failover, and the admin calls."""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc
from grpc import aio

from broker import channels
from broker.audit import AuditLog
from broker.client import convert
from broker.client.base import (
    CALL_TIMEOUT_S,
    CHANNEL_OPTIONS,
    CONNECT_TIMEOUT_S,
    DEFAULT_URL,
    FAILOVER_TIMEOUT_S,
    T,
    ready,
)
from broker.client.consumer import Consumer
from broker.client.errors import (
    ConnectionLost,
    InvalidArgument,
    OutcomeUnknown,
    PinmqError,
    from_rpc,
    moved_under,
)
from broker.client.info import ClusterGroups, ClusterStatus
from broker.client.producer import Producer
from broker.credentials import Credentials
from broker.futures import taken
from broker.info import ConsumerInfo, GroupInfo, QueueInfo
from broker.message import GROUP_ID_HEADER
from broker.tls import TlsFiles
from pinmq_pb import client_pb2 as pb
from pinmq_pb import client_pb2_grpc as pb_grpc

MAX_ROUND_PAUSE_S = 0.25  # between rounds of connect attempts while no address answers
# After a deadline passed: how long a node's keepalive has to show it froze (a ping is sent
# within one interval and given up within another).
FROZEN_WAIT_S = 2 * channels.KEEPALIVE_MS / 1000 + 1.0
log = logging.getLogger("pinmq.client")


def _warn(text: str) -> None:
    log.warning(text)


class Client:
    """A connection to a pinmq node: the first reachable address of `url`.

    `url` is "host:port[,host:port...]". Use as `async with Client(url) as client:`.
    With `audit` (a directory, or an `AuditLog`), the client records `client_sent` (once the
    node confirmed the send), `client_received` and `client_acked` events for `pinmq check`,
    and tags every message it sends with a `pinmq-mid` header (producer id / sequence).
    Every request has a deadline, `call_timeout` seconds (a send_many batch: for its result);
    one that passes it fails with `OutcomeUnknown`. A send the node holds for room (address-
    full-policy BLOCK, a full disk) has none: `on_blocked` (default: a logging warning) is
    told and the send waits.

    Failover: when the connection drops (a node that died, stopped or stopped answering; a
    call past its deadline on a node that then fails its keepalive pings counts too),
    the client moves to the next address of `url` that answers, in turns, for at most
    `failover_timeout` seconds (default: 30 with several addresses; 0, no failover, with
    one: its calls then fail as they come and the channel reconnects by itself). It moves as
    a whole: consumers subscribe again, sends and reads that the drop cut short run again
    (sends with the same messages: their `_AMQ_DUPL_ID` lets the node drop a copy it has).
    Past the timeout they fail with `ConnectionLost` (or `OutcomeUnknown` for a request that
    may have been done). `on_failover` (default: a logging warning) is told of each move.

    `tls`: the nodes speak TLS; the client trusts `tls.ca` and presents `tls.cert` (for a
    node with `client-auth: required`). Every address of `url` must match its node's
    certificate (its names and addresses). `user` and `password`: the client's credentials
    for a node with security on, sent on every call (over TLS: base64 hides nothing); a node
    checks the password once per connection.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        call_timeout: float = CALL_TIMEOUT_S,
        failover_timeout: float | None = None,
        audit: str | Path | AuditLog | None = None,
        audit_name: str | None = None,
        on_blocked: Callable[[str], None] | None = None,
        on_failover: Callable[[str], None] | None = None,
        tls: TlsFiles | None = None,
        user: str | None = None,
        password: str | None = None,
    ):
        if (user is None) != (password is None):
            raise InvalidArgument("give user and password together", "INVALID_ARGUMENT")
        self.user = user
        # The call metadata that carries the credentials (none without a user).
        self.metadata = (
            Credentials(user, password).metadata()
            if user is not None and password is not None
            else ()
        )
        self.tls = tls  # TLS to every address: the CA to trust, a certificate if asked for one
        self.addresses = [a.strip() for a in url.split(",") if a.strip()]
        if not self.addresses:
            raise InvalidArgument(f"no address in url {url!r}", "INVALID_ARGUMENT")
        self.target = self.addresses[0]
        self.generation = 0
        self._connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        if failover_timeout is None:
            failover_timeout = FAILOVER_TIMEOUT_S if len(self.addresses) > 1 else 0.0
        self.failover_timeout = failover_timeout
        self._channel: aio.Channel | None = None
        self._broker: pb_grpc.BrokerStub
        self._admin: pb_grpc.AdminStub
        self._moving: asyncio.Task[None] | None = None  # the move under way, shared by waiters
        # Audit log (broker/audit.py): opened on connect when given a directory.
        self.audit: AuditLog | None = audit if isinstance(audit, AuditLog) else None
        self._audit_dir = None if audit is None or isinstance(audit, AuditLog) else Path(audit)
        self._audit_name = audit_name or f"client-{uuid.uuid4().hex[:8]}"
        self._producers = itertools.count(1)
        self.on_blocked = on_blocked or _warn
        self.on_failover = on_failover or _warn

    @property
    def fails_over(self) -> bool:
        return self.failover_timeout > 0

    async def connect(self) -> None:
        """Open a channel to the first address that answers within the connect timeout
        (trying them in turns for up to `failover_timeout`)."""
        target, channel = await self._open(self.addresses)
        self._use(target, channel)
        if self._audit_dir is not None and self.audit is None:
            self.audit = AuditLog(self._audit_dir, self._audit_name, node=target).start()

    async def close(self) -> None:
        if self._moving is not None:
            self._moving.cancel()
            await asyncio.gather(self._moving, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        if self._audit_dir is not None and self.audit is not None:
            self.audit.close()
            self.audit = None

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _open(self, order: list[str]) -> tuple[str, aio.Channel]:
        """A ready channel to the first of `order` that answers; one round at least, more
        (with a pause between rounds, as a refused connection fails at once) until
        `failover_timeout` has passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.failover_timeout
        pause = 0.1
        while True:
            for target in order:
                channel = channels.dial(target, CHANNEL_OPTIONS, self.tls)
                connected = False
                try:
                    connected = await ready(channel, self._connect_timeout)
                finally:
                    if not connected:
                        await channel.close()
                if connected:
                    return target, channel
            remaining = deadline - loop.time()
            if remaining <= 0:
                within = f" within {self.failover_timeout:g} s" if self.fails_over else ""
                raise ConnectionLost(
                    f"cannot reach a pinmq node at {', '.join(order)}{within} "
                    "(connection refused or timed out)",
                    "UNAVAILABLE",
                )
            await asyncio.sleep(min(pause, remaining))
            # An ha backup serves about a failure-timeout (1 s) after its primary died: a
            # round every quarter second finds it soon after, at the cost of a few refused
            # connects per second while nothing answers.
            pause = min(2 * pause, MAX_ROUND_PAUSE_S)

    def _use(self, target: str, channel: aio.Channel) -> None:
        self.target, self._channel = target, channel
        self._broker = pb_grpc.BrokerStub(channel)
        self._admin = pb_grpc.AdminStub(channel)
        self.generation += 1

    async def _move(self, generation: int) -> None:
        """Connect to the next address that answers, after the current one, unless the
        client has moved since `generation` already. Concurrent callers share one move;
        ConnectionLost when no address answers within `failover_timeout`."""
        moving = self._start_move(generation)
        if moving is None:
            return
        await asyncio.wait([moving])  # a waiter that is cancelled leaves the move running
        if moving.cancelled():
            raise ConnectionLost(
                "the client was closed while moving: nothing was sent", "CANCELLED"
            )
        moving.result()

    def _start_move(self, generation: int) -> asyncio.Task[None] | None:
        """The move away from the node of `generation` (begun now, or the one under way);
        None if the client has moved since."""
        if generation != self.generation:
            return None
        if self._channel is None:
            raise ConnectionLost("the client is closed: nothing was sent", "CANCELLED")
        if self._moving is None or self._moving.done():
            self._moving = asyncio.create_task(self._move_on())
            self._moving.add_done_callback(taken)
        return self._moving

    async def _move_on(self) -> None:
        """Move to another address; the old channel is closed once the new one is in use, so
        the calls still on it end (CANCELLED) knowing that the client moved under them."""
        old, channel = self.target, self._channel
        after = self.addresses.index(old) + 1
        target, new = await self._open(self.addresses[after:] + self.addresses[:after])
        self._use(target, new)
        self.on_failover(f"lost the connection to {old}; now connected to {target}")
        if channel is not None:
            await channel.close()

    async def _with_failover(
        self, attempt: Callable[[], Awaitable[T]], *, repeat_unknown: bool
    ) -> T:
        """Run `attempt`, and again on the next node each time the connection drops under it.

        Only an attempt that was never sent runs again, or, with `repeat_unknown`, one whose
        outcome is unknown (reads, and sends: their duplicate ids make a copy harmless). The
        failover ends `failover_timeout` after the first drop (a node that takes the call
        and drops it again is not retried forever); when it gives up after an attempt that
        may have been done, the outcome is unknown.
        """
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        maybe_done: PinmqError | None = None
        while True:
            generation = self.generation
            try:
                return await attempt()
            except PinmqError as caught:
                err = await self._frozen_or_slow(caught, generation)
                if not self._cut_short(err, generation, repeat_unknown):
                    if err is caught:
                        raise
                    self._start_move(generation)  # a frozen node: later calls go elsewhere
                    raise err from caught
                if not isinstance(err, ConnectionLost):
                    maybe_done = err
                last = err
            if deadline is None:
                deadline = loop.time() + self.failover_timeout
            try:
                if loop.time() >= deadline:
                    raise ConnectionLost(
                        f"no node took it within {self.failover_timeout:g} s", "UNAVAILABLE"
                    )
                await self._move(generation)
            except ConnectionLost as gave_up:
                outcome = ConnectionLost if maybe_done is None else OutcomeUnknown
                raise outcome(
                    f"{maybe_done or last}; and no node to try again: {gave_up}", "UNAVAILABLE"
                ) from None

    async def _frozen_or_slow(self, err: PinmqError, generation: int) -> PinmqError:
        """`err`, or for a deadline passed on a node that then fails its keepalive pings (it
        froze: a stopped process, a hung host), the dropped connection it is, to fail over
        from as an outage is. A node that answers its pings is slow, not gone: the client
        stays, and `err` (an unknown outcome past the deadline) stands.

        Waits at most two keepalive intervals and a margin, and only with somewhere to go."""
        channel = self._channel
        if err.code != "DEADLINE_EXCEEDED" or not self.fails_over or channel is None:
            return err
        if generation == self.generation:
            loop = asyncio.get_running_loop()
            until = loop.time() + FROZEN_WAIT_S
            state = channel.get_state()
            while state == grpc.ChannelConnectivity.READY:
                try:
                    async with asyncio.timeout(until - loop.time()):
                        await channel.wait_for_state_change(state)
                except TimeoutError:
                    return err  # its pings were answered all along
                state = channel.get_state()
        return OutcomeUnknown(
            f"{err}; {self.target} has stopped answering its keepalive pings", "UNAVAILABLE"
        )

    def _cut_short(self, err: PinmqError, generation: int, repeat_unknown: bool) -> bool:
        """Whether a failover may run again the attempt that `err` ended on `generation`."""
        if not self.fails_over:
            return False
        if isinstance(err, ConnectionLost):
            return True
        moved = generation != self.generation and err.code == "CANCELLED"
        dropped = isinstance(err, OutcomeUnknown) and err.code == "UNAVAILABLE"
        return repeat_unknown and (moved or dropped)

    async def _call(self, method: str, request: Any, *, changes: bool = False) -> Any:
        """One unary Admin call with the client's deadline; failures as refused, lost or
        unknown. A read runs again after a failover; a change only if it was never sent."""

        async def attempt() -> Any:
            target = self.target
            try:
                return await getattr(self._admin, method)(
                    request, timeout=self.call_timeout, metadata=self.metadata
                )
            except grpc.RpcError as err:
                raise from_rpc(err, target) from None
            except asyncio.CancelledError:
                raise moved_under("call", target) from None

        return await self._with_failover(attempt, repeat_unknown=not changes)

    def _blocked(self) -> None:
        self.on_blocked(
            f"send blocked by {self.target}: the node is full (address-full-policy BLOCK or "
            "limits.max-disk-usage); it completes once consumers make room"
        )

    # ---- producing and consuming ----

    def producer(
        self,
        address: str,
        *,
        group_id: str | None = None,
        auto_group: bool = False,
        group_header: str = GROUP_ID_HEADER,
        persistent: bool = True,
    ) -> Producer:
        """A producer; with `group_id` or `auto_group` every message joins that one group."""
        if group_id is not None and auto_group:
            raise InvalidArgument("give group_id or auto_group, not both", "INVALID_ARGUMENT")
        group = str(uuid.uuid4()) if auto_group else group_id
        producer = Producer(self, address, group, group_header, persistent)
        if self.audit is not None:
            producer.producer_id = f"{self._audit_name}.p{next(self._producers)}"
        return producer

    def consumer(self, queue: str, *, name: str | None = None, prefetch: int = 100) -> Consumer:
        """A consumer of `queue`; it subscribes on first use (iteration or `start()`)."""
        return Consumer(self, queue, name or f"py-{uuid.uuid4().hex[:8]}", prefetch)

    # ---- administration ----

    async def create_queue(
        self, queue: str, *, address: str | None = None, **settings: Any
    ) -> None:
        """Create `queue` on `address` (default: same name); settings as in the node config."""
        request = pb.CreateQueueRequest(
            address=address or queue, queue=queue, settings=convert.settings_pb(settings)
        )
        await self._call("CreateQueue", request, changes=True)

    async def delete_queue(self, queue: str) -> int:
        """Delete `queue` and its messages; returns how many messages were removed."""
        reply = await self._call("DeleteQueue", pb.DeleteQueueRequest(queue=queue), changes=True)
        return reply.removed_messages

    async def queues(self) -> list[QueueInfo]:
        reply = await self._call("ListQueues", pb.ListQueuesRequest())
        return [convert.queue_info(q) for q in reply.queues]

    async def groups(self, queue: str) -> list[GroupInfo]:
        reply = await self._call("ListGroups", pb.ListGroupsRequest(queue=queue))
        return [convert.group_info(g) for g in reply.groups]

    async def consumers(self, queue: str) -> list[ConsumerInfo]:
        """The queue's consumers: what each holds, and whether it stalls."""
        reply = await self._call("ListGroups", pb.ListGroupsRequest(queue=queue))
        return [convert.consumer_info(c) for c in reply.consumers]

    async def reset_groups(self, queue: str, group: str | None = None) -> None:
        """Unpin one group (or all): their next messages may go to any consumer."""
        request = pb.ResetGroupsRequest(queue=queue, group=group)
        await self._call("ResetGroups", request, changes=True)

    # ---- the cluster (clustered nodes only) ----

    async def cluster_groups(
        self, queue: str | None = None, *, group: str | None = None
    ) -> ClusterGroups:
        """Every group of the cluster (of one queue, one group) in one call, from any node."""
        request = pb.ClusterGroupsRequest(queue=queue or "", group=group or "")
        return convert.cluster_groups(await self._call("ClusterGroups", request))

    async def cluster_reset_group(
        self, group: str, queue: str | None = None, *, force: bool = False
    ) -> int:
        """Unbind a group cluster-wide (on one queue, or every queue); every node unpins it.

        Returns how many bindings were removed. A group bound to a node that is not connected
        is refused (`FAILED_PRECONDITION`) unless `force`: its messages wait for that node,
        and after a forced move they reach a consumer when it returns, out of order.
        """
        request = pb.ClusterResetGroupRequest(group=group, queue=queue, force=force)
        reply = await self._call("ClusterResetGroup", request, changes=True)
        return reply.removed

    async def cluster_status(self) -> ClusterStatus:
        return convert.cluster_status(await self._call("ClusterStatus", pb.ClusterStatusRequest()))

    # ---- metrics ----

    async def metrics_text(self) -> str:
        """The node's metrics in the Prometheus text format, as `GET /metrics` serves them
        (`manage` on every address with security on); parse them with prometheus-client."""
        return (await self._call("Metrics", pb.MetricsRequest())).text
