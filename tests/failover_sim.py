"""A seeded, deterministic simulation of an HA pair and its voters (cluster/failover.py).

Four processes: the pair (node1, node1-backup) and two voters (node2, node3). Messages are
delayed, lost and reordered; links are cut and healed; processes crash (keeping only what they
persisted), restart, and freeze (SIGSTOP) while their peers carry on. Clients propose group
bindings to whichever process serves; a toy replication (appends while the backup is in sync,
snapshots to catch up) stands in for the store stream. As the real one (cluster/replication.py),
it keeps its own word on whether the backup is in sync, apart from what the member last told the
voters, and while the backup is in sync by that word every write waits for it. After every
step the simulation checks:

* no two processes may serve node1 at the same moment;
* the process that serves holds every binding ever acknowledged, so no acknowledged binding is
  lost and no arbiter ever accepts one that conflicts with it.

Run `python tests/failover_sim.py --seeds 100000` for a long soak; a failing seed prints its
trace and replays exactly with `--seed N`.
"""

from __future__ import annotations

import argparse
import copy
import heapq
import random
import sys
import time
from dataclasses import dataclass, field

from cluster.failover import Durable, Member
from cluster.failover_messages import Message, Send
from cluster.failover_states import Role
from cluster.failover_voting import Ballot, Timing, Voter

PRIMARY, BACKUP = "node1", "node1-backup"
VOTERS = ("node2", "node3")
NAMES = (PRIMARY, BACKUP, *VOTERS)
TIMING = Timing(heartbeat_interval=20, failure_timeout=100)
TICK = 5
HORIZON = 2000
CALM = 900  # the last stretch has no new faults: the cluster must settle within it
GROUPS = [f"g{i}" for i in range(12)]
TARGETS = ("node1", "node2", "node3")


# Replication messages of the toy store stream, active -> passive and back.
@dataclass(frozen=True)
class Append:
    sender: str
    epoch: int
    index: int
    entry: tuple[str, str]


@dataclass(frozen=True)
class Snapshot:
    sender: str
    epoch: int
    log: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Applied:
    sender: str
    epoch: int
    index: int
    snapshot: bool


Wire = Message | Append | Snapshot | Applied


class Violation(AssertionError):
    """An invariant broke; the message names the seed, the time and what broke."""


@dataclass
class Proc:
    name: str
    offset: int  # its clock reads global time + offset: only durations may matter
    node: Voter | Member
    alive: bool = True
    paused_until: int = 0
    ballot: Ballot | None = None  # persisted copies
    durable: Durable | None = None
    log: list[tuple[str, str]] = field(default_factory=list)  # durable bindings, in order
    pending: list[tuple[int, int]] = field(default_factory=list)  # (index, written at)
    replicated: int = 0  # active: highest index the peer applied at this epoch
    replica_synced: bool = False  # active: its replication holds the peer in sync
    snapshot_at: int = -(10**9)
    held: list[Wire] = field(default_factory=list)  # delivered while frozen, read on waking
    restarts: int = 0


class Sim:
    def __init__(
        self,
        seed: int,
        *,
        faults: bool = True,
        trace: bool = False,
        allow_failback: bool | None = None,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.faults = faults
        self.trace: list[str] | None = [] if trace else None
        failback = self.rng.random() < 0.5
        self.allow_failback = failback if allow_failback is None else allow_failback
        self.now = 0
        self.net: list[tuple[int, int, str, Wire]] = []
        self._n = 0
        self._stream_at: dict[tuple[str, str], int] = {}  # replication is FIFO per link
        self.cuts: dict[frozenset[str], int] = {}  # cut link -> heals at
        self.muted: dict[frozenset[str], int] = {}  # link without failover messages -> until
        self.restart_at: dict[str, int] = {}
        self.acked: dict[str, str] = {}
        self.activations = 0
        self.acks = 0
        self.procs = {name: self._spawn(name, self.rng.randrange(10**6)) for name in NAMES}

    # ---- processes

    def _spawn(self, name: str, offset: int, old: Proc | None = None) -> Proc:
        ballot = copy.deepcopy(old.ballot) if old else None
        durable = copy.deepcopy(old.durable) if old else None
        restarts = old.restarts + 1 if old else 0
        now = self.now + offset
        node: Voter | Member
        if name in (PRIMARY, BACKUP):
            node = Member(
                name,
                BACKUP if name == PRIMARY else PRIMARY,
                VOTERS,
                TIMING,
                now,
                primary=name == PRIMARY,
                allow_failback=self.allow_failback,
                ballot=ballot,
                durable=durable,
                rng=random.Random(f"{self.seed}/{name}/{restarts}"),
            )
        else:
            node = Voter(name, TIMING, now, ballot)
        proc = Proc(name, offset, node, ballot=ballot, durable=durable, restarts=restarts)
        if old:
            proc.log = old.log
        return proc

    def _local(self, proc: Proc) -> int:
        return self.now + proc.offset

    def _persist(self, proc: Proc) -> None:
        if proc.node.changed:
            proc.ballot = copy.deepcopy(proc.node.ballot)
            if isinstance(proc.node, Member):
                proc.durable = copy.deepcopy(proc.node.durable)
            proc.node.changed = False

    def _note(self, text: str) -> None:
        if self.trace is not None:
            self.trace.append(f"t={self.now} {text}")

    # ---- network

    def _send(self, sender: str, to: str, message: Wire) -> None:
        delay = self.rng.randint(1, 10) if self.rng.random() < 0.9 else self.rng.randint(10, 80)
        at = self.now + delay
        if isinstance(message, Append | Snapshot | Applied):  # one ordered stream, as in gRPC
            at = max(at, self._stream_at.get((sender, to), 0))
            self._stream_at[(sender, to)] = at
        self._n += 1
        heapq.heappush(self.net, (at, self._n, to, message))

    def _emit(self, proc: Proc, sends: list[Send]) -> None:
        self._persist(proc)  # what a message depends on is on disk before it leaves
        for send in sends:
            self._send(proc.name, send.to, send.message)

    def _deliver(self) -> None:
        for proc in self.procs.values():  # what waited in a frozen process's socket comes first
            if proc.held and proc.paused_until <= self.now:
                held, proc.held = proc.held, []
                for message in held:
                    self._receive(proc, message)
        while self.net and self.net[0][0] <= self.now:
            _, _, to, message = heapq.heappop(self.net)
            proc = self.procs[to]
            sender = message.sender if hasattr(message, "sender") else message.candidate
            link = frozenset((sender, to))
            if not proc.alive or link in self.cuts:
                continue
            if link in self.muted and not isinstance(message, Append | Snapshot | Applied):
                continue
            if self.faults and self.rng.random() < 0.03:
                continue
            self._note(f"{sender} -> {to}: {message}")
            if proc.paused_until > self.now:
                proc.held.append(message)
            else:
                self._receive(proc, message)

    def _receive(self, proc: Proc, message: Wire) -> None:
        node, now = proc.node, self._local(proc)
        if isinstance(message, Append | Snapshot | Applied):
            if isinstance(node, Member):
                self._replication(proc, node, message)
            return
        if isinstance(node, Member):
            before = node.role
            self._emit(proc, node.receive(message, now))
            self._after(proc, node, before)
            return
        if hasattr(message, "seq"):  # a heartbeat
            reply = node.on_heartbeat(message, now)  # type: ignore[arg-type]
            self._emit(proc, [Send(message.sender, reply)])  # type: ignore[union-attr]
        elif hasattr(message, "candidate"):
            reply = node.on_vote_request(message, now)  # type: ignore[arg-type]
            self._emit(proc, [Send(message.candidate, reply)])  # type: ignore[union-attr]

    # ---- the toy replication, in place of the store stream

    def _replication(self, proc: Proc, node: Member, message: Append | Snapshot | Applied) -> None:
        now = self._local(proc)
        following = node.role.follows and node.active == message.sender
        if isinstance(message, Snapshot):
            # The replica streams from its peer, whether or not a heartbeat of that epoch
            # came first (cluster/replica.py): the member decides what the copy is worth.
            standing = node.role not in (Role.ACTIVE, Role.RELEASING)
            if standing and message.epoch >= node.ballot.record.epoch:
                proc.log = list(message.log)
                node.synced(message.epoch)
                self._persist(proc)
                reply = Applied(proc.name, message.epoch, len(proc.log), True)
                self._send(proc.name, message.sender, reply)
        elif isinstance(message, Append):
            if following and node.in_sync and message.epoch == node.ballot.record.epoch:
                if message.index == len(proc.log) + 1:
                    proc.log.append(message.entry)
                    self._send(
                        proc.name,
                        message.sender,
                        Applied(proc.name, message.epoch, message.index, False),
                    )
                elif message.index > len(proc.log) + 1:
                    node.unsynced()  # a gap: wait for the next snapshot
        elif (
            node.role is Role.ACTIVE and message.epoch == node.epoch and message.sender == node.peer
        ):
            if message.snapshot and message.index == len(proc.log):
                proc.replicated = message.index
                proc.replica_synced = True
                self._emit(proc, node.backup_synced(now))
            elif not message.snapshot and proc.replica_synced:
                proc.replicated = max(proc.replicated, message.index)

    def _serve(self, proc: Proc, node: Member) -> None:
        """The active's side: catch the backup up, acknowledge writes, take a client's."""
        now = self._local(proc)
        if not proc.replica_synced and now - proc.snapshot_at >= TIMING.heartbeat_interval:
            proc.snapshot_at = now
            self._send(proc.name, node.peer, Snapshot(proc.name, node.epoch, tuple(proc.log)))
        while proc.pending:
            index, written = proc.pending[0]
            replicated = proc.replicated >= index
            if proc.replica_synced:  # the write waits for the backup, whatever voters know
                acked = replicated and node.may_serve(now)
            else:
                acked = node.may_ack(now, replicated=False)
            if acked:
                proc.pending.pop(0)
                self._ack(proc, proc.log[index - 1])
                continue
            late = now - written > TIMING.failure_timeout // 2
            if proc.replica_synced and not replicated and late:
                proc.replica_synced = False
                self._emit(proc, node.backup_lost(now))
            break
        if self.rng.random() < 0.3 and node.may_serve(now):
            self._propose(proc, node, self.rng.choice(GROUPS), self.rng.choice(TARGETS))

    def propose(self, group: str, target: str) -> None:
        """A client's proposal to whichever process serves node1 now."""
        for name in self.serving():
            proc = self.procs[name]
            self._propose(proc, proc.node, group, target)  # type: ignore[arg-type]

    def _propose(self, proc: Proc, node: Member, group: str, target: str) -> None:
        bound = next((t for g, t in reversed(proc.log) if g == group), None)
        if bound is not None:
            if group in self.acked and self.acked[group] != bound:
                self._fail(f"{proc.name} answers {group}->{bound}, acked {self.acked[group]}")
            return
        proc.log.append((group, target))
        index = len(proc.log)
        proc.pending.append((index, self._local(proc)))
        if proc.replica_synced:
            self._send(proc.name, node.peer, Append(proc.name, node.epoch, index, (group, target)))

    def _ack(self, proc: Proc, entry: tuple[str, str]) -> None:
        group, target = entry
        if self.acked.get(group, target) != target:
            self._fail(f"{proc.name} acks {group}->{target}, acked before: {self.acked[group]}")
        self.acked[group] = target
        self.acks += 1
        self._note(f"{proc.name} acks {group}->{target}")

    def _after(self, proc: Proc, node: Member, before: Role) -> None:
        if node.role is Role.ACTIVE and before is not Role.ACTIVE:
            self.activations += 1
            proc.replicated, proc.pending, proc.replica_synced = 0, [], False
            self._note(f"{proc.name} active at epoch {node.epoch}")
        elif before is Role.ACTIVE and node.role is not Role.ACTIVE:
            proc.pending = []  # not acknowledged: the clients hear an error
            self._note(f"{proc.name} steps down from epoch {node.epoch}")

    # ---- faults

    def crash(self, name: str, restart_in: int | None = None) -> None:
        """kill -9: only what it persisted survives; it restarts after `restart_in`, if given."""
        self.procs[name].alive = False
        if restart_in is not None:
            self.restart_at[name] = self.now + restart_in
        self._note(f"{name} crashes")

    def restart(self, name: str) -> None:
        self.procs[name] = self._spawn(name, self.rng.randrange(10**6), self.procs[name])
        self._note(f"{name} restarts")

    def freeze(self, name: str, duration: int) -> None:
        """SIGSTOP now, SIGCONT after `duration`: what was sent to it waits in its socket."""
        proc = self.procs[name]
        proc.paused_until = max(proc.paused_until, self.now + duration)
        self._note(f"{name} frozen until {proc.paused_until}")

    def cut(self, a: str, b: str, duration: int) -> None:
        """Drop everything between `a` and `b` for `duration`."""
        self.cuts[frozenset((a, b))] = self.now + duration
        self._note(f"link {a}-{b} cut")

    def mute(self, a: str, b: str, duration: int) -> None:
        """Drop the failover messages between `a` and `b` for `duration`, not replication's:
        its own connection runs while the heartbeats' channel waits out a reconnect backoff."""
        self.muted[frozenset((a, b))] = self.now + duration
        self._note(f"failover messages {a}-{b} muted")

    def _faults(self) -> None:
        for name, at in list(self.restart_at.items()):
            if at <= self.now:
                del self.restart_at[name]
                self.restart(name)
        for links in (self.cuts, self.muted):
            for link, at in list(links.items()):
                if at <= self.now:
                    del links[link]
        if not self.faults or self.now > HORIZON - CALM:
            return  # the last stretch is calm: the cluster must settle
        rng = self.rng
        roll = rng.random()
        name = rng.choice(NAMES)
        if roll < 0.006 and self.procs[name].alive:
            self.crash(name, restart_in=rng.randint(20, 400))
        elif roll < 0.012 and self.procs[name].alive:
            self.freeze(name, rng.randint(20, 300))
        elif roll < 0.024:
            self.cut(name, rng.choice([n for n in NAMES if n != name]), rng.randint(20, 500))

    # ---- the run

    def step(self) -> None:
        self.now += TICK
        self._faults()
        self._deliver()
        for proc in self.procs.values():
            if not proc.alive or proc.paused_until > self.now:
                continue
            node = proc.node
            if isinstance(node, Member):
                before = node.role
                self._emit(proc, node.tick(self._local(proc)))
                self._after(proc, node, before)
                if node.role is Role.ACTIVE:
                    self._serve(proc, node)
        self._check()

    def _check(self) -> None:
        serving = self.serving()
        if len(serving) > 1:
            self._fail(f"two processes serve node1: {serving}")
        for proc in map(self.procs.__getitem__, serving):
            bound = dict(proc.log)
            lost = {g: t for g, t in self.acked.items() if bound.get(g) != t}
            if lost:
                self._fail(f"{proc.name} serves without acknowledged bindings {lost}")

    def _fail(self, text: str) -> None:
        tail = "\n".join(self.trace[-60:]) if self.trace else "(replay with --seed for a trace)"
        raise Violation(f"seed {self.seed}, t={self.now}: {text}\n{tail}")

    def run(self, until: int = HORIZON) -> Sim:
        while self.now < until:
            self.step()
        return self

    def serving(self) -> list[str]:
        return [
            p.name
            for p in self.procs.values()
            if p.alive and isinstance(p.node, Member) and p.node.may_serve(self._local(p))
        ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10_000, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--seed", type=int, help="replay one seed with its trace")
    args = parser.parse_args()
    if args.seed is not None:
        sim = Sim(args.seed, trace=True)
        try:
            sim.run()
        except Violation as exc:
            print(exc)
            return 1
        print("\n".join(sim.trace or []))
        print(f"seed {args.seed}: ok, {sim.activations} activations, {sim.acks} acks")
        return 0
    started = time.perf_counter()
    activations = acks = 0
    for seed in range(args.start, args.start + args.seeds):
        try:
            sim = Sim(seed).run()
        except Violation as exc:
            print(f"FAILED {exc}\nreplay: python tests/failover_sim.py --seed {seed}")
            return 1
        activations += sim.activations
        acks += sim.acks
        if (seed - args.start + 1) % 10_000 == 0:
            print(f"{seed - args.start + 1} seeds ok", file=sys.stderr)
    elapsed = time.perf_counter() - started
    print(f"{args.seeds} seeds ok in {elapsed:.1f} s: {activations} activations, {acks} acks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
