"""The voting side of failover (cluster/failover.py) that every cluster member has: how long
promises last (`Timing`), how many make a quorum, and the `Voter` that keeps a `Ballot` (its
votes and its record of the active) and promises not to vote while an active is heard.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from cluster.failover_messages import (
    Heartbeat,
    HeartbeatReply,
    Message,
    Record,
    VoteReply,
    VoteRequest,
)


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

    def answer_within(self, message: Message) -> int:
        """How long an answer to `message` can still count, so how long a shell waits for it:
        a vote as long as the (pre-)candidacy lasts, a heartbeat's promise until it expires.
        A voter persists its vote before it answers; a shell that gave up sooner would lose
        a vote granted by a voter whose disk is slow, and the election would be repeated."""
        match message:
            case VoteRequest():
                return self.failure_timeout
            case Heartbeat():
                return self.promise
        return 2 * self.heartbeat_interval

    @property
    def election(self) -> int:
        """How long a pair may be without an active when nothing is wrong (a start, a failover):
        the last promise runs out, the member waits out its patience, asks for pre-votes and
        for votes; twice, as one round may be wasted (voters not up yet, a duel of rivals)."""
        return 2 * (4 * self.failure_timeout + self.heartbeat_interval)


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
