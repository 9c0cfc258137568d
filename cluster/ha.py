"""ha shells around the failover state machine (cluster/failover.py): the pair member's and
the voters'. They move its messages over `Cluster.Failover`, feed it the clock, and persist
its durable state before anything that depends on it leaves.

Names: a pair member is named by its node id (the primary's is the logical node's, node1);
a voter by the address the pair reaches it at (its `cluster.connectors` entry), since that is
what the pair knows of it before it ever answers. Only the count of voters matters to quorums.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import grpc
import structlog
from grpc import aio

from broker import channels
from broker.config import NodeConfig
from broker.engine import NotServing
from broker.info import HaPairStatus
from cluster.failover import Durable, Member
from cluster.failover_messages import (
    Handover,
    Heartbeat,
    HeartbeatReply,
    Message,
    Record,
    Send,
    VoteReply,
    VoteRequest,
)
from cluster.failover_states import Role
from cluster.failover_voting import Ballot, Timing, Voter, quorum
from cluster.ha_wire import from_pb, to_pb
from cluster.state_file import StateFile
from pinmq_pb import cluster_pb2 as pb
from pinmq_pb import cluster_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

STATE_FILE = "ha-state.json"  # a pair member's ballot, data epoch, peer
VOTES_FILE = "ha-votes.json"  # a voter's ballot per pair
TICK_S = 0.02  # well inside the 5 % by which a promise outlives the active's count of it
ASKING = {Role.PASSIVE.value, Role.PRE_CANDIDATE.value}  # a member that asks in vain, again


def grace_s(timing: Timing, reconnect_interval_ms: int) -> float:
    """How long a state that is normal while a pair elects or a peer restarts (no active, no
    LOCAL grouping handler, replication broken off, a backup out of sync) may last before it
    is logged as a warning or an error: an election that takes a second round
    (`Timing.election`), then four reconnect-intervals for the links to the new active."""
    return (timing.election + 4 * reconnect_interval_ms) / 1000


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Fenced(NotServing):
    """This process may not serve the logical node now: it lost its quorum or its epoch."""


def _ballot(data: dict[str, Any] | None) -> Ballot | None:
    if not data:
        return None
    return Ballot(data["voted"], data["granted"], Record(**data["record"]))


def _caller(message: Message) -> str:
    match message:
        case Heartbeat() | HeartbeatReply() | VoteReply() | Handover():
            return message.sender
        case VoteRequest():
            return message.candidate


class VoterRegistry:
    """A cluster member's votes for every pair it hears from (`<data-dir>/ha-votes.json`).

    A promise lasts the pair's failure-timeout, which its messages carry; after a restart,
    until the pair is heard again, the longest that any config allows is assumed.
    """

    def __init__(self, data_dir: Path) -> None:
        self.file = StateFile(data_dir / VOTES_FILE)
        saved = self.file.read() or {}
        now = now_ms()
        self.voters = {
            logical: Voter(logical, Timing(failure_timeout=data["promise_ms"]), now, _ballot(data))
            for logical, data in saved.items()
        }

    def timing(self) -> Timing:
        """The timing of the pairs it votes for, as far as their messages tell (the longest
        failure-timeout), else the default: how long a pair may take to elect."""
        longest = max((v.timing.failure_timeout for v in self.voters.values()), default=0)
        return Timing(failure_timeout=max(longest, Timing().failure_timeout))

    def receive(self, envelope: pb.FailoverEnvelope) -> list[pb.FailoverEnvelope]:
        message = from_pb(envelope)
        logical = envelope.logical
        timing = Timing(failure_timeout=envelope.failure_timeout_ms or Timing().failure_timeout)
        voter = self.voters.get(logical)
        if voter is None:
            voter = self.voters[logical] = Voter(logical, timing, now_ms())
        elif timing.failure_timeout > voter.timing.failure_timeout:
            voter.timing = timing  # never shorter than what it may have promised
        if isinstance(message, Heartbeat):
            reply: Message = voter.on_heartbeat(message, now_ms())
        elif isinstance(message, VoteRequest):
            reply = voter.on_vote_request(message, now_ms())
        else:
            return []
        if voter.changed and not self._persist():
            return []  # not on disk: the reply may not leave (a vote forgotten is a vote twice)
        return [to_pb(logical, reply)]

    def _persist(self) -> bool:
        data = {
            logical: {**asdict(voter.ballot), "promise_ms": voter.timing.failure_timeout}
            for logical, voter in self.voters.items()
        }
        if not self.file.save(data):
            return False
        for voter in self.voters.values():
            voter.changed = False
        return True


class PairShell:
    """One process of the pair: runs its `Member`, reaches the others, keeps its state.

    `on_change` is called after anything that may change whether this process should serve
    (the pair process then starts or stops its node); `status` is for health and logs.
    """

    def __init__(self, config: NodeConfig, on_change: Callable[[], None]) -> None:
        ha, cluster = config.ha, config.cluster
        assert ha is not None and cluster is not None
        self.name = config.node.id
        self.primary = ha.role == "primary"
        self.tls = config.tls_files  # failover messages ride on mutual TLS, when set
        self.file = StateFile(Path(config.node.data_dir) / STATE_FILE)
        saved = self.file.read() or {}
        self.logical: str | None = saved.get("logical") or (self.name if self.primary else None)
        self.peer_address: str | None = saved.get("peer_address") or ha.primary
        peer = saved.get("peer") or ("" if self.primary else (self.logical or ""))
        self.timing = Timing(ha.heartbeat_interval, ha.failure_timeout)
        self.grace_s = grace_s(self.timing, cluster.reconnect_interval)
        voters = [a for a in cluster.connectors if a != self.peer_address]
        durable = Durable(saved["durable"]["data_epoch"]) if saved.get("durable") else None
        self.member = Member(
            self.name,
            peer,
            voters,
            self.timing,
            now_ms(),
            primary=self.primary,
            allow_failback=ha.allow_failback,
            ballot=_ballot(saved.get("ballot")),
            durable=durable,
            rng=random.Random(),  # seeded by the OS: rivals' waits differ from run to run
        )
        self.on_change = on_change
        self._channels: dict[str, aio.Channel] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._ticking: asyncio.Task[None] | None = None
        self._waiting_alone: list[asyncio.Future[None]] = []
        self._backup_watch: asyncio.TimerHandle | None = None  # active: a backup out of sync
        self._last = self.describe()
        self._defeat = self.member.defeat

    # ---- what the node asks

    @property
    def epoch(self) -> int:
        return self.member.epoch

    def may_serve(self) -> bool:
        return self.member.may_serve(now_ms())

    def admit_alone(self) -> asyncio.Future[None] | None:
        """A write no in-sync backup confirms: None if it may be acknowledged now, else a
        future that resolves once enough voters know the backup is out of sync (or fails)."""
        member, now = self.member, now_ms()
        if not member.may_serve(now):
            raise Fenced(f"{self.name} does not hold node {self.logical} now")
        if member.may_ack(now, replicated=False):
            return None
        future = asyncio.get_running_loop().create_future()
        self._waiting_alone.append(future)
        return future

    def backup_synced(self) -> None:
        """The backup holds every write up to where writes began to wait for it: those that
        wait to be acknowledged alone were tapped before (in its snapshot or shipped to it),
        so they are on its disk too. They are acknowledged now: the voters, told it is in
        sync, will not hear otherwise while it stays so, and they would wait for good (a
        fresh primary's writes during its backup's first snapshot stalled a chaos run)."""
        self._handle(self.member.backup_synced(now_ms()))
        self._settle_waiting(backup_holds_them=True)
        if self._backup_watch is not None:
            self._backup_watch.cancel()
            self._backup_watch = None

    def backup_lost(self) -> None:
        """The backup went away or fell behind: normal while it restarts, worth a warning
        if it is not back in sync within the grace period."""
        self._handle(self.member.backup_lost(now_ms()))
        if self._ticking is not None and self._backup_watch is None:
            loop = asyncio.get_running_loop()
            self._backup_watch = loop.call_later(self.grace_s, self._backup_still_lost)

    def _backup_still_lost(self) -> None:
        self._backup_watch = None
        member = self.member
        if member.role is Role.ACTIVE and not member.backup_in_sync:
            log.warning(
                "the backup is still out of sync: writes are acknowledged without it",
                backup=member.peer,
                after_s=self.grace_s,
            )

    def replica_synced(self, epoch: int) -> None:
        """Passive: the snapshot of the active of `epoch` is on disk, and the stream runs."""
        self.member.synced(epoch)
        self._persist()

    def replica_broke(self) -> None:
        self.member.unsynced()

    def peer_is(self, name: str, address: str) -> None:
        """The primary learns its backup when it connects for replication."""
        if (self.member.peer, self.peer_address) != (name, address):
            member = self.member
            member.peer = name
            self.peer_address = address
            member.voters = sorted(v for v in member.voters if v != address)
            member.quorum = quorum(len(member.voters))
            self._persist(force=True)

    def describe(self) -> dict[str, Any]:
        member = self.member
        return {
            "logical": self.logical,
            **member.status(now_ms()),
            "peer": member.peer or None,
            "peer_address": self.peer_address,
        }

    # ---- running

    def start(self) -> None:
        self._ticking = asyncio.create_task(self._tick_loop(), name="failover-tick")

    async def stop(self) -> None:
        ticking, self._ticking = self._ticking, None
        if ticking is not None:
            ticking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticking
        if self._backup_watch is not None:
            self._backup_watch.cancel()
            self._backup_watch = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def _tick_loop(self) -> None:
        while True:
            self._handle(self.member.tick(now_ms()))
            await asyncio.sleep(TICK_S)

    def receive(self, envelope: pb.FailoverEnvelope) -> list[pb.FailoverEnvelope]:
        """An incoming message; returns what goes back to its sender."""
        message = from_pb(envelope)
        if message is None:
            return []
        if self.logical is None and not self.primary and envelope.to_peer:
            self.logical = envelope.logical  # the backup learns whom it backs up
            self.member.peer = envelope.logical
            if not self._persist(force=True):
                return []
        if envelope.logical != self.logical:
            return []
        caller = _caller(message)
        sends = self.member.receive(message, now_ms())
        back = [s for s in sends if s.to == caller]
        if not self._handle([s for s in sends if s.to != caller]):
            return []  # not on disk: nothing that depends on it goes back either
        assert self.logical is not None
        return [self._envelope(s.message) for s in back]

    def _envelope(self, message: Message, to_peer: bool = False) -> pb.FailoverEnvelope:
        assert self.logical is not None
        return to_pb(self.logical, message, self.timing.failure_timeout, to_peer)

    def hears(self, envelope: pb.FailoverEnvelope) -> bool:
        """Is `envelope` for this pair member (else for the voter in the same process)?"""
        if self.logical is None:
            return envelope.to_peer and not self.primary
        return envelope.logical == self.logical

    def _handle(self, sends: list[Send]) -> bool:
        """Save the member's state, then send; False (nothing sent, as if lost) if the state
        could not be saved."""
        if not self._persist():
            return False
        for send in sends:
            address = self.peer_address if send.to == self.member.peer else send.to
            if address and self.logical is not None:
                task = asyncio.ensure_future(self._deliver(address, send))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        self._settle_waiting()
        member = self.member
        if member.defeat != self._defeat and member.defeat is not None:
            epoch, why = self._defeat = member.defeat
            log.info("election lost: standing again later", epoch=epoch, why=why)
        now = self.describe()
        if now != self._last:
            before, self._last = self._last, now
            changed = {k for k, v in now.items() if before.get(k) != v}
            changed &= {"role", "epoch", "serving", "active"}
            if changed:
                # Asking whether it may stand, and being told no, repeats while no active
                # is heard: no news.
                retry = changed == {"role"} and {before["role"], now["role"]} <= ASKING
                (log.debug if retry else log.info)("failover state", **now)
            self.on_change()
        return True

    async def _deliver(self, address: str, send: Send) -> None:
        assert self.logical is not None
        channel = self._channels.get(address)
        if channel is None:
            # Keepalive: a process whose own network went away (docker network disconnect)
            # keeps its connections open with no error until TCP gives up, a quarter of an
            # hour; every heartbeat on them would time out, and the process could never get
            # its quorum back once its network returned (found by the chaos run, seed 2026).
            options = [*channels.keepalive(), *channels.reconnect()]
            channel = channels.dial(address, options, self.tls)
            self._channels[address] = channel
        timeout = self.timing.answer_within(send.message) / 1000
        try:
            answer = await pb_grpc.ClusterStub(channel).Failover(
                self._envelope(send.message, send.to == self.member.peer), timeout=timeout
            )
        except aio.AioRpcError:
            return  # lost, like any message: heartbeats repeat, votes time out
        for envelope in answer.replies:
            message = from_pb(envelope)
            if message is None:
                continue
            if address != self.peer_address and isinstance(message, HeartbeatReply | VoteReply):
                message = replace(message, sender=address)  # a voter is its address to us
            self._handle(self.member.receive(message, now_ms()))

    def _settle_waiting(self, backup_holds_them: bool = False) -> None:
        if not self._waiting_alone:
            return
        member, now = self.member, now_ms()
        if not member.may_serve(now) or member.role is not Role.ACTIVE:
            error = Fenced(f"{self.name} no longer holds node {self.logical}")
            for future in self._waiting_alone:
                if not future.done():
                    future.set_exception(error)
            self._waiting_alone.clear()
        elif backup_holds_them or member.may_ack(now, replicated=False):
            for future in self._waiting_alone:
                if not future.done():
                    future.set_result(None)
            self._waiting_alone.clear()

    def _persist(self, force: bool = False) -> bool:
        """Whether the member's state is on disk (saved now if it changed)."""
        member = self.member
        if not (member.changed or force):
            return True
        saved = self.file.save(
            {
                "logical": self.logical,
                "peer": member.peer,
                "peer_address": self.peer_address,
                "ballot": asdict(member.ballot),
                "durable": asdict(member.durable),
            }
        )
        # Cleared only once saved: until then whatever would go out waits for it (a forced
        # save that failed counts as a change, so the next one tries again).
        member.changed = not saved
        return saved


def known_pairs(
    pair: PairShell | None, backup_in_sync: bool | None, voters: VoterRegistry
) -> list[HaPairStatus]:
    """The pairs this node knows of: from the voters' records, or, on the active process,
    from its own member (`backup_in_sync`: its replication's view, when it has one)."""
    found: dict[str, HaPairStatus] = {}
    for logical, voter in voters.voters.items():
        r = voter.ballot.record
        if r.epoch:
            found[logical] = HaPairStatus(
                logical, r.epoch, r.active or "", r.backup or "", r.backup_in_sync, False
            )
    if pair is not None and pair.logical and pair.member.role is Role.ACTIVE:
        m = pair.member
        in_sync = m.backup_in_sync if backup_in_sync is None else backup_in_sync
        found[pair.logical] = HaPairStatus(pair.logical, m.epoch, m.name, m.peer, in_sync, True)
    return [found[logical] for logical in sorted(found)]


class PassiveService(pb_grpc.ClusterServicer):
    """What a pair process that does not serve answers on listen.cluster: failover only, its
    own pair's and, as a voter, other pairs' (where every node is a pair, the passive
    processes are half the voters)."""

    def __init__(self, shell: PairShell, voters: VoterRegistry) -> None:
        self.shell = shell
        self.voters = voters

    async def Failover(
        self, request: pb.FailoverEnvelope, context: aio.ServicerContext
    ) -> pb.FailoverReplies:
        if self.shell.hears(request):
            return pb.FailoverReplies(replies=self.shell.receive(request))
        return pb.FailoverReplies(replies=self.voters.receive(request))

    async def Gossip(self, request_iterator: Any, context: aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.shell.name} is passive")

    async def Replicate(self, request_iterator: Any, context: aio.ServicerContext) -> None:
        """The peer, passive too until one of them is elected, asks to follow: not yet."""
        await context.abort(
            grpc.StatusCode.UNAVAILABLE, f"{self.shell.name} is passive: nothing to follow yet"
        )
