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
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable
from dataclasses import dataclass, field, replace


def quorum(voters: int) -> int:
    """Votes (or promises) one process needs, out of the `voters` + 1 other members."""
    return (voters + 1) // 2 + 1


@dataclass(frozen=True)
class Timing:
    """Milliseconds: heartbeats every `heartbeat_interval`; a promise lasts `failure_timeout`."""

    heartbeat_interval: int = 200
    failure_timeout: int = 1000

    @property
    def promise(self) -> int:
        """How long the active counts on a promise after sending the heartbeat it answered:
        a little less than a voter keeps it, for clocks whose rates differ slightly."""
        return self.failure_timeout - self.failure_timeout // 20


# ---------------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class Heartbeat:
    """From the active to every other member: its epoch and what its backup holds."""

    sender: str
    epoch: int
    seq: int
    backup: str  # the sender's peer
    backup_in_sync: bool
    releasing: bool = False  # the sender stopped serving and frees the promises (failback)


@dataclass(frozen=True)
class HeartbeatReply:
    sender: str
    epoch: int  # the heartbeat's
    seq: int
    accepted: bool
    known_epoch: int
    wants_failback: bool = False  # from a passive primary with allow-failback, once in sync


@dataclass(frozen=True)
class VoteRequest:
    candidate: str
    epoch: int
    data_epoch: int  # epoch of the newest active whose data the candidate holds in full
    pre: bool = False  # "would you?": answered alike, but nothing is promised or recorded


@dataclass(frozen=True)
class VoteReply:
    sender: str
    epoch: int
    granted: bool
    known_epoch: int
    record: Record  # the voter's: a candidate learns from it what an active announced
    pre: bool = False


@dataclass(frozen=True)
class Handover:
    """From an active that stopped serving to its in-sync peer: take over now."""

    sender: str
    epoch: int


Message = Heartbeat | HeartbeatReply | VoteRequest | VoteReply | Handover


@dataclass(frozen=True)
class Send:
    to: str
    message: Message


# ---------------------------------------------------------------------------------- voting


@dataclass(frozen=True)
class Record:
    """What the last accepted active said: persisted by every member, so a restart keeps it."""

    epoch: int = 0
    active: str | None = None
    backup: str | None = None
    backup_in_sync: bool = False
    seq: int = 0


@dataclass
class Ballot:
    """A member's durable voting state: persist it before sending what depends on it."""

    voted: int = 0  # highest epoch this member voted in, for itself or another: once each
    granted: int = 0  # highest epoch it voted in for another member
    record: Record = field(default_factory=Record)

    @property
    def epoch(self) -> int:
        """Highest epoch seen: a new candidacy takes the next one."""
        return max(self.voted, self.record.epoch)

    @property
    def fence(self) -> int:
        """Heartbeats below it are refused. Its own failed candidacies do not count, so a
        stale member that stood in vain still follows (and never deposes) the real active."""
        return max(self.granted, self.record.epoch)


class Voter:
    """The voting side that every member has: promises, votes, the record of the active."""

    def __init__(self, name: str, timing: Timing, now: int, ballot: Ballot | None = None):
        self.name = name
        self.timing = timing
        self.ballot = ballot or Ballot()
        # After a restart we cannot know what we promised before: assume a promise runs.
        self.promised_until = now + timing.failure_timeout if ballot else now
        self.changed = False  # the ballot changed: the shell persists it before sending

    def on_heartbeat(self, hb: Heartbeat, now: int) -> HeartbeatReply:
        ballot, record = self.ballot, self.ballot.record
        if hb.epoch < ballot.fence or (
            hb.epoch == record.epoch and record.active not in (None, hb.sender)
        ):
            return HeartbeatReply(self.name, hb.epoch, hb.seq, False, ballot.fence)
        if hb.epoch > record.epoch or hb.seq > record.seq:
            new = Record(hb.epoch, hb.sender, hb.backup, hb.backup_in_sync, hb.seq)
            # Persisted when what it says changes, with the seq then: an older heartbeat
            # delivered late after a restart is still told apart.
            self.changed |= replace(new, seq=0) != replace(record, seq=0)
            ballot.record = new
        if hb.releasing:
            self.promised_until = now
        else:
            self.promised_until = max(self.promised_until, now + self.timing.failure_timeout)
        return HeartbeatReply(self.name, hb.epoch, hb.seq, True, ballot.fence)

    def on_vote_request(self, req: VoteRequest, now: int) -> VoteReply:
        ballot, record = self.ballot, self.ballot.record
        eligible = req.data_epoch >= record.epoch and (
            record.epoch == 0
            or req.candidate == record.active
            or (req.candidate == record.backup and record.backup_in_sync)
        )
        if req.epoch <= ballot.epoch or now < self.promised_until or not eligible:
            return VoteReply(self.name, req.epoch, False, ballot.fence, record, req.pre)
        if req.pre:
            return VoteReply(self.name, req.epoch, True, ballot.fence, record, True)
        ballot.voted = ballot.granted = req.epoch
        self.changed = True
        self.promised_until = now + self.timing.failure_timeout
        return VoteReply(self.name, req.epoch, True, ballot.fence, record, False)


# ---------------------------------------------------------------------------------- a pair member


class Role(enum.Enum):
    PASSIVE = "passive"
    CANDIDATE = "candidate"
    ACTIVE = "active"
    RELEASING = "releasing"  # stopped serving to hand over (failback)


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
        self.backup_in_sync = False
        self._announced_seq = 0  # first heartbeat that carried the current backup_in_sync
        self._told: set[str] = set()  # voters that accepted it
        # Candidate state.
        self._votes: set[str] = set()
        self._asked_at = 0
        self._released_at = 0
        self._pre_epoch = 0  # asking whether a quorum would vote at this epoch (0: not)
        self._pre_votes: set[str] = set()

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
        return self._announce(True, now) if self.role is Role.ACTIVE else []

    def backup_lost(self, now: int) -> list[Send]:
        """Active: the peer missed a write (gone, too slow): carry on once voters know."""
        return self._announce(False, now) if self.role is Role.ACTIVE else []

    def synced(self, epoch: int) -> None:
        """Passive: caught up with the active of `epoch`."""
        if self.role is Role.PASSIVE and epoch == self.ballot.record.epoch:
            self.in_sync = True
            self.durable.data_epoch = epoch
            self.changed = True

    def unsynced(self) -> None:
        """Passive: replication broke off; a catch-up is needed before it counts as in sync."""
        self.in_sync = False

    # ---- time and messages

    def tick(self, now: int) -> list[Send]:
        if self.role is Role.ACTIVE:
            if self.backup_in_sync and now - self._peer_heard > self.timing.failure_timeout:
                return self._announce(False, now)  # the backup is gone: say so, carry on
            return self._beat(now) if now >= self._next_beat else []
        if self.role is Role.CANDIDATE:
            if now - self._asked_at >= self.timing.failure_timeout:
                self.role = Role.PASSIVE  # no quorum in time: wait, then stand again
                self._stand_at = now + self._patience()
            return []
        if self.role is Role.RELEASING:
            if now - self._released_at >= self.timing.failure_timeout:
                self.role = Role.PASSIVE  # the handover did not happen: stand again later
                self._stand_at = now + self._patience()
            return []
        if self._pre_epoch and now - self._asked_at >= self.timing.failure_timeout:
            self._pre_epoch = 0  # no quorum would vote: wait, then ask again
            self._stand_at = now + self._patience()
        due = not self._pre_epoch and now >= max(self._stand_at, self.promised_until)
        return self._ask(now) if due and self._may_stand() else []

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
                if self.role is Role.PASSIVE and self.in_sync and ours:
                    self.promised_until = now
                    return self._stand(now)
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

    def _ask(self, now: int) -> list[Send]:
        """Pre-vote: stand only if a quorum would vote for us, so a candidate that cannot win
        (stale data, an active still heard by the voters) never takes votes from one that can."""
        self._pre_epoch = self.epoch + 1
        self._pre_votes = set()
        self._asked_at = now
        req = VoteRequest(self.name, self._pre_epoch, self.durable.data_epoch, pre=True)
        return [Send(to, req) for to in self._others()]

    def _stand(self, now: int) -> list[Send]:
        self._pre_epoch = 0
        self.role = Role.CANDIDATE
        self.active = None
        self.ballot.voted = self.epoch + 1
        self.changed = True
        self._votes = set()
        self._promises.clear()
        self._asked_at = now
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
            live = self.role is Role.PASSIVE and reply.epoch == self._pre_epoch
            if live and reply.granted and reply.epoch > self.epoch:
                self._pre_votes.add(reply.sender)
                if len(self._pre_votes) >= self.quorum:
                    return self._stand(now)
            return []
        if self.role is not Role.CANDIDATE or reply.epoch != self.ballot.voted:
            return []
        if reply.known_epoch > reply.epoch:
            self._step_down()
            return []
        if reply.granted:
            self._votes.add(reply.sender)
            # The voter promised when it granted, which was after we asked.
            self._promises[reply.sender] = self._asked_at + self.timing.promise
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
            self._step_down()
        return [Send(req.candidate, reply)]

    def _on_heartbeat(self, hb: Heartbeat, now: int) -> list[Send]:
        followed = (self.active, self.ballot.record.epoch)
        reply = self.on_heartbeat(hb, now)
        if not reply.accepted or hb.releasing:  # a release promises nothing: stand on
            return [Send(hb.sender, reply)]
        if self.role is not Role.PASSIVE:
            self._step_down()
        if followed != (hb.sender, hb.epoch):
            self.in_sync = False  # a new active, or the same at a new epoch: catch up first
        self.active = hb.sender
        self._stand_at = now + self._patience()
        wants = self.primary and self.allow_failback and self.in_sync
        return [Send(hb.sender, replace(reply, wants_failback=wants))]

    def _step_down(self) -> None:
        """Back to passive: an active or candidate that learnt of a newer epoch, or voted."""
        if self.role is not Role.PASSIVE:
            self.role = Role.PASSIVE
            self.active = None
            self.in_sync = False
            self._promises.clear()
            self._stand_at = self.promised_until + self._patience()

    def _patience(self) -> int:
        t = self.timing
        return t.failure_timeout + self._rng.randrange(t.heartbeat_interval + 1)

    # ---- active

    def _activate(self, now: int) -> list[Send]:
        self.role = Role.ACTIVE
        self.active = self.name
        epoch = self.ballot.voted
        self.durable = Durable(data_epoch=epoch)
        self.ballot.record = Record(epoch, self.name, self.peer, False, 0)
        self.changed = True
        self._seq = 0
        self._sent.clear()
        self.backup_in_sync = False
        self._announced_seq = 1
        self._told = set()
        return self._beat(now)

    def _announce(self, in_sync: bool, now: int) -> list[Send]:
        if in_sync == self.backup_in_sync:
            return []
        self.backup_in_sync = in_sync
        self._peer_heard = now
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
                self._step_down()
            return []
        sent = self._sent.get(reply.seq)
        if sent is not None:
            until = sent + self.timing.promise
            self._promises[reply.sender] = max(self._promises.get(reply.sender, 0), until)
        if reply.seq >= self._announced_seq and reply.sender in self.voters:
            self._told.add(reply.sender)
        if reply.sender == self.peer:
            self._peer_heard = now
        failback = reply.sender == self.peer and reply.wants_failback
        if failback and self.backup_in_sync and self.may_serve(now):
            return self._release(now)
        return []

    def _release(self, now: int) -> list[Send]:
        """Failback: stop serving, free the voters' promises, tell the in-sync peer to stand."""
        self.role = Role.RELEASING
        self._released_at = now
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
            **({"backup_in_sync": self.backup_in_sync} if active else {"in_sync": self.in_sync}),
        }
