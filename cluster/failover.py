"""Who serves a logical node that has a primary and a backup process: pure, clock passed in.

One logical node (node1) runs as two processes, a pair: the primary and its backup. At most one
of them is *active* (serves clients, arbitrates bindings); the other is *passive* (follows the
active, applies its replication stream). Every other cluster member is a *voter* for the pair.
Members exchange four messages; the shells move them and call the methods below with the time.

Why leases, not just votes
    A vote alone cannot stop an old active that does not know it was replaced (frozen by
    SIGSTOP, or cut off). So every accepted heartbeat is also a promise: the member that
    accepted it (a voter, or the passive) will not vote for anyone else for `failure-timeout`
    after receiving it. The active serves only while it holds unexpired promises from a quorum
    (`quorum(k)` of the k + 1 others: the voters and its peer), counted from when it *sent*
    the heartbeat, so its own view always expires first. A candidate needs the same quorum of
    votes, from members whose promise has run out, and the active never votes for a rival.
    With k voters a quorum is more than half of k + 1, so any two quorums share a voter: two
    processes can never serve one logical node at the same moment, whatever the network does
    (only the clocks' rates are trusted, never their readings).

Why epochs
    Each activation is at a higher epoch, voted for once per epoch by each member. Heartbeats,
    replication and arbiter answers carry it; a member refuses anything from a lower epoch than
    the highest it has seen, so a deposed active learns it is deposed from its first reply.

Why "in sync" is announced
    An acknowledged write must survive any later activation. While the passive is in sync,
    the active acknowledges a write only once the passive has it. When the passive falls out
    of sync (gone, lagging) the active may carry on alone only after enough voters have heard
    so, because a voter refuses to elect an out-of-sync backup: `may_ack(replicated=False)`
    needs that announcement accepted by `k - quorum(k) + 1` voters, which leaves the stale
    backup short of a quorum. Each voter's `Record` is the last state an active told it.

Failback: a returning primary never activates by itself; it follows the active and syncs. With
allow-failback, once it is in sync the active stops serving, releases the voters' promises and
hands over; the primary is then elected at a new epoch with the same data.

The parts: the messages and the record (cluster/failover_messages.py), the voting side every
member has (cluster/failover_voting.py), a pair member's roles and the one table of their
transitions (cluster/failover_states.py), and here the pair `Member`, which decides when an
event happened and does what entering a role takes.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, replace

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
from cluster.failover_states import Event, Role, next_role, takes
from cluster.failover_voting import Ballot, Timing, Voter, quorum


@dataclass
class Durable:
    """What a pair member persists besides its ballot: the data it holds."""

    data_epoch: int = 0  # epoch of the newest active whose data it holds in full


class Member(Voter):
    """One process of the pair. The shell calls `tick` every few ms and `receive` per message,
    sends what they return, asks `may_serve` before every client action or binding decision
    and `may_ack` before acknowledging a durable write, and tells it about replication with
    `backup_synced` / `backup_lost` (active side) and `synced` / `unsynced` (passive side)."""

    def __init__(
        self,
        name: str,
        peer: str,
        voters: Iterable[str],
        timing: Timing,
        now: int,
        *,
        primary: bool,
        allow_failback: bool = False,
        ballot: Ballot | None = None,
        durable: Durable | None = None,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(name, timing, now, ballot)
        self.peer = peer
        self.voters = sorted(voters)
        self.quorum = quorum(len(self.voters))
        self.primary = primary
        self.allow_failback = allow_failback
        self.durable = durable or Durable()
        self.role = Role.PASSIVE
        self.active: str | None = None  # whom a passive follows
        self.in_sync = False  # passive: holds everything the active it follows acknowledged
        self._copy_epoch = 0  # the epoch of the active whose stream to it runs, caught up
        self._rng = rng or random.Random(name)
        fresh = ballot is None and self.durable.data_epoch == 0
        # A fresh primary starts the cluster; anyone else waits to hear from an active first.
        self._stand_at = now if fresh and primary else now + self._patience()
        # Active state.
        self._seq = 0
        self._sent: dict[int, int] = {}  # heartbeat seq -> when sent
        self._promises: dict[str, int] = {}  # member -> promise good until
        self._next_beat = now
        self._peer_heard = now  # last accepted heartbeat reply from the peer
        # Replication's word: the peer holds every write, and every new one waits for it. What
        # the voters are told (`backup_in_sync`) also needs the peer heard within a
        # failure-timeout; replication says it once per sync, so the member keeps it apart.
        self._replica_in_sync = False
        self.backup_in_sync = False
        self._announced_seq = 0  # first heartbeat that carried the current backup_in_sync
        self._told: set[str] = set()  # voters that accepted it
        # Pre-candidate and candidate state.
        self._since = now  # when the member entered its role
        self._pre_epoch = 0  # the epoch a pre-candidate asks about
        self._pre_votes: set[str] = set()
        self._votes: set[str] = set()
        self._refused: set[str] = set()
        # Why its last candidacy failed (epoch, reason): a repeated election says why.
        self.defeat: tuple[int, str] | None = None
        # The active it followed until it heard none, and stood against: a takeover (None
        # after a start, or when it was handed the node).
        self.took_over: str | None = None
        self.elected = 0  # times it became the active process since it started
        self.takeovers = 0  # of which it stood against an active that fell silent: failovers

    # ---- what the shell asks

    @property
    def epoch(self) -> int:
        return self.ballot.epoch

    def may_serve(self, now: int) -> bool:
        """Active with a quorum of unexpired promises: serve clients, decide bindings."""
        if self.role is not Role.ACTIVE:
            return False
        return sum(1 for until in self._promises.values() if until > now) >= self.quorum

    def may_ack(self, now: int, replicated: bool) -> bool:
        """Whether a write may be acknowledged: on the in-sync backup (`replicated`), or the
        backup is out of sync and enough voters know it to never elect it."""
        if not self.may_serve(now):
            return False
        if self.backup_in_sync:
            return replicated
        return len(self._told) >= len(self.voters) - self.quorum + 1

    # ---- replication events from the shell

    def backup_synced(self, now: int) -> list[Send]:
        """Active: the peer now holds everything acknowledged, and gets every new write."""
        if self.role is not Role.ACTIVE:
            return []
        self._replica_in_sync = True
        self._peer_heard = now
        return self._announce(True, now)

    def backup_lost(self, now: int) -> list[Send]:
        """Active: the peer missed a write (gone, too slow): carry on once voters know."""
        if self.role is not Role.ACTIVE:
            return []
        self._replica_in_sync = False
        return self._announce(False, now)

    def synced(self, epoch: int) -> None:
        """Passive: caught up with the active of `epoch` (its snapshot on disk).

        The data counts even before a heartbeat of that epoch is heard, and while this
        member stands (a candidate still follows the stream): the active may die first (its
        stream to us ran, its heartbeats did not), and whether this copy may be elected is
        the voters' to judge, by what that active announced to them. Following it
        (`in_sync`) waits for its heartbeat."""
        if self.role in (Role.ACTIVE, Role.RELEASING) or epoch < self.ballot.record.epoch:
            return  # an active follows no one; or a stream from an active older than one we know
        self._copy_epoch = epoch
        self.in_sync = self.role.follows and epoch == self.ballot.record.epoch
        if epoch > self.durable.data_epoch:
            self.durable.data_epoch = epoch
            self.changed = True

    def unsynced(self) -> None:
        """Passive: replication broke off; a catch-up is needed before it counts as in sync."""
        self.in_sync = False
        self._copy_epoch = 0

    # ---- time and messages

    def tick(self, now: int) -> list[Send]:
        timing = self.timing
        match self.role:
            case Role.ACTIVE:
                if self.backup_in_sync and now - self._peer_heard > timing.failure_timeout:
                    return self._announce(False, now)  # the backup is gone: say so, carry on
                return self._beat(now) if now >= self._next_beat else []
            case Role.PASSIVE:
                due = now >= max(self._stand_at, self.promised_until)
                return self._ask(now) if due and self._may_stand() else []
            case Role.PRE_CANDIDATE | Role.CANDIDATE | Role.RELEASING:
                if now - self._since >= timing.failure_timeout:
                    if self.role is Role.CANDIDATE:
                        self._lost(
                            f"{self._tally()} within failure-timeout ({timing.failure_timeout} ms)"
                        )
                    self._to(Event.TIMED_OUT, now)  # no quorum, or no handover, in time:
                    self._stand_at = now + self._patience()  # wait, then stand again
                return []

    def receive(self, message: Message, now: int) -> list[Send]:
        match message:
            case Heartbeat():
                return self._on_heartbeat(message, now)
            case HeartbeatReply():
                return self._on_heartbeat_reply(message, now)
            case VoteRequest():
                return self._on_vote_request(message, now)
            case VoteReply():
                return self._on_vote_reply(message, now)
            case Handover():
                record = self.ballot.record
                ours = message.sender == self.active and message.epoch == record.epoch
                if takes(self.role, Event.HANDOVER) and self.in_sync and ours:
                    self.promised_until = now
                    return self._stand(Event.HANDOVER, now)
                return []

    # ---- passive and candidate

    def _may_stand(self) -> bool:
        record = self.ballot.record
        if record.epoch == 0:
            return self.primary  # bootstrap: only the primary starts a fresh cluster
        if self.durable.data_epoch < record.epoch:
            return False  # its data is older than the active it last heard of
        # Whether a backup is in sync is the voters' to judge, from the active's latest word:
        # ours may be older (the heartbeat saying "in sync again" may not have reached us).
        return self.name in (record.active, record.backup)

    def _to(self, event: Event, now: int) -> Role:
        """Take `event` (cluster/failover_states.py's table): the role it leaves."""
        before, self.role = self.role, next_role(self.role, event)
        if self.role is not before:
            self._since = now
        return before

    def _ask(self, now: int) -> list[Send]:
        """Pre-vote: stand only if a quorum would vote for us, so a candidate that cannot win
        (stale data, an active still heard by the voters) never takes votes from one that can."""
        self._to(Event.QUIET, now)
        self._pre_epoch = self.epoch + 1
        self._pre_votes = set()
        req = VoteRequest(self.name, self._pre_epoch, self.durable.data_epoch, pre=True)
        return [Send(to, req) for to in self._others()]

    def _stand(self, event: Event, now: int) -> list[Send]:
        """A candidacy at a new epoch, after a pre-vote or a handover."""
        self._to(event, now)
        silent = event is Event.PRE_VOTED and self.active != self.name
        self.took_over = self.active if silent else None
        self.active = None
        self.ballot.voted = self.epoch + 1
        self.changed = True
        self._votes = set()
        self._refused = set()
        self._promises.clear()
        req = VoteRequest(self.name, self.ballot.voted, self.durable.data_epoch)
        return [Send(to, req) for to in self._others()]

    def _on_vote_reply(self, reply: VoteReply, now: int) -> list[Send]:
        # A newer epoch is skipped by our next candidacy, so rivals do not duel on one epoch.
        self.ballot.voted = max(self.ballot.voted, reply.known_epoch)
        # What an active announced, heard late: it may show our data is stale or our copy
        # out of sync, and then we stop standing (and taking votes from who could win).
        mine = self.ballot.record
        if (reply.record.epoch, reply.record.seq) > (mine.epoch, mine.seq):
            self.ballot.record = reply.record
            self.changed = True
        if reply.pre:
            live = self.role is Role.PRE_CANDIDATE and reply.epoch == self._pre_epoch
            if live and reply.granted and reply.epoch > self.epoch:
                self._pre_votes.add(reply.sender)
                if len(self._pre_votes) >= self.quorum:
                    return self._stand(Event.PRE_VOTED, now)
            return []
        if self.role is not Role.CANDIDATE or reply.epoch != self.ballot.voted:
            return []
        if reply.known_epoch > reply.epoch:
            self._step_down(now, f"{reply.sender} knows epoch {reply.known_epoch}")
            return []
        if reply.granted:
            self._votes.add(reply.sender)
            # The voter promised when it granted, which was after we asked.
            self._promises[reply.sender] = self._since + self.timing.promise
        else:
            self._refused.add(reply.sender)
        if len(self._votes) >= self.quorum:
            return self._activate(now)
        return []

    def _on_vote_request(self, req: VoteRequest, now: int) -> list[Send]:
        busy = self.role is Role.CANDIDATE and req.epoch <= self.ballot.voted
        if busy or self.may_serve(now):
            record = self.ballot.record
            refusal = VoteReply(self.name, req.epoch, False, self.ballot.fence, record, req.pre)
            return [Send(req.candidate, refusal)]
        reply = self.on_vote_request(req, now)
        if reply.granted and not req.pre:
            self._step_down(now, f"voted for {req.candidate} at epoch {req.epoch}")
        return [Send(req.candidate, reply)]

    def _on_heartbeat(self, hb: Heartbeat, now: int) -> list[Send]:
        reply = self.on_heartbeat(hb, now)
        if not reply.accepted or hb.releasing:  # a release promises nothing: stand on
            return [Send(hb.sender, reply)]
        self._step_down(now, f"{hb.sender} is active at epoch {hb.epoch}")
        # In sync while that active's stream runs caught up: it may have come before the
        # heartbeat (a new active), or run on while this member stood.
        self.in_sync = self._copy_epoch == hb.epoch
        self.active = hb.sender
        self._stand_at = now + self._patience()
        wants = self.primary and self.allow_failback and self.in_sync
        return [Send(hb.sender, replace(reply, wants_failback=wants))]

    def _step_down(self, now: int, why: str) -> None:
        """Outranked: an active, candidate or releasing member goes back to passive."""
        if self.role is Role.CANDIDATE:
            self._lost(why)
        if self._to(Event.OUTRANKED, now) is self.role:
            return  # a passive member, or one asking whether it may stand: nothing to undo
        self.active = None
        self.in_sync = False
        self._promises.clear()
        self._stand_at = self.promised_until + self._patience()

    def _lost(self, why: str) -> None:
        self.defeat = (self.ballot.voted, why)

    def _tally(self) -> str:
        heard = self._votes | self._refused
        unheard = [m for m in self._others() if m and m not in heard]
        return (
            f"{len(self._votes)} of the {self.quorum} votes needed"
            f" (refused by {sorted(self._refused) or 'none'}, no answer from {unheard or 'none'})"
        )

    def _patience(self) -> int:
        t = self.timing
        return t.failure_timeout + self._rng.randrange(t.heartbeat_interval + 1)

    # ---- active

    def _activate(self, now: int) -> list[Send]:
        self._to(Event.ELECTED, now)
        self.elected += 1
        self.takeovers += self.took_over is not None
        self.active = self.name
        epoch = self.ballot.voted
        self.durable = Durable(data_epoch=epoch)
        self._copy_epoch = 0  # it follows no one now
        self.ballot.record = Record(epoch, self.name, self.peer, False, 0)
        self.changed = True
        self._seq = 0
        self._sent.clear()
        self._replica_in_sync = self.backup_in_sync = False
        self._announced_seq = 1
        self._told = set()
        return self._beat(now)

    def _announce(self, in_sync: bool, now: int) -> list[Send]:
        if in_sync == self.backup_in_sync:
            return []
        self.backup_in_sync = in_sync
        self._announced_seq = self._seq + 1
        self._told = set()
        self.changed = True
        return self._beat(now)

    def _beat(self, now: int, releasing: bool = False) -> list[Send]:
        self._seq += 1
        self._sent[self._seq] = now
        self._next_beat = now + self.timing.heartbeat_interval
        expired = now - self.timing.failure_timeout
        for seq in [s for s, sent in self._sent.items() if sent < expired]:
            del self._sent[seq]
        epoch, in_sync = self.epoch, self.backup_in_sync
        self.ballot.record = Record(epoch, self.name, self.peer, in_sync, self._seq)
        hb = Heartbeat(self.name, epoch, self._seq, self.peer, in_sync, releasing)
        return [Send(to, hb) for to in self._others()]

    def _on_heartbeat_reply(self, reply: HeartbeatReply, now: int) -> list[Send]:
        if self.role is not Role.ACTIVE or reply.epoch != self.epoch:
            return []
        if not reply.accepted:
            if reply.known_epoch > self.epoch:
                self._step_down(now, f"{reply.sender} knows epoch {reply.known_epoch}")
            return []
        sent = self._sent.get(reply.seq)
        if sent is not None:
            until = sent + self.timing.promise
            self._promises[reply.sender] = max(self._promises.get(reply.sender, 0), until)
        if reply.seq >= self._announced_seq and reply.sender in self.voters:
            self._told.add(reply.sender)
        if reply.sender != self.peer:
            return []
        self._peer_heard = now
        if not self.backup_in_sync:
            # Heard again after a silence (its heartbeats may wait out a reconnect backoff
            # longer than replication takes to sync it): while replication holds it in sync,
            # say so again; a failback waits until the voters heard that.
            return self._announce(True, now) if self._replica_in_sync else []
        if reply.wants_failback and self.may_serve(now):
            return self._release(now)
        return []

    def _release(self, now: int) -> list[Send]:
        """Failback: stop serving, free the voters' promises, tell the in-sync peer to stand."""
        self._to(Event.FAILBACK, now)
        self._promises.clear()
        out = self._beat(now, releasing=True)
        self.promised_until = now
        return [*out, Send(self.peer, Handover(self.name, self.epoch))]

    def _others(self) -> list[str]:
        return [self.peer, *self.voters]

    # ---- health

    def status(self, now: int) -> dict[str, object]:
        """What health and logs say about this member."""
        active = self.role is Role.ACTIVE
        return {
            "role": self.role.value,
            "epoch": self.epoch,
            "serving": self.may_serve(now),
            "active": self.name if active else self.active,
            "elected": self.elected,
            "takeovers": self.takeovers,
            **({"backup_in_sync": self.backup_in_sync} if active else {"in_sync": self.in_sync}),
        }
