"""The failover state machine (cluster/failover.py): drills in the deterministic simulation
(tests/failover_sim.py) for each fault the design names, then 2,000 random seeds
(`make sim` runs more).

Every step of every run checks that no two processes serve node1 and that the one serving
holds every acknowledged binding; these tests add what each drill must end with. Times are
simulated milliseconds (heartbeat 20, failure-timeout 100), not wall-clock time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from grpc import aio
from ports import reserve_port

from broker.config_file import parse_config
from cluster.failover import Durable, Member
from cluster.failover_messages import Heartbeat, Record, VoteReply, VoteRequest
from cluster.failover_states import TRANSITIONS, BadTransition, Event, Role, next_role
from cluster.failover_voting import Ballot, Timing, Voter, quorum
from cluster.ha import PairShell, VoterRegistry
from pinmq_pb import cluster_pb2 as pb
from pinmq_pb import cluster_pb2_grpc as pb_grpc
from tests.failover_sim import BACKUP, PRIMARY, Sim, Violation

SEEDS = 2_000  # `make sim` runs many more: seeds from 2,000 on


def started(allow_failback: bool = False, seed: int = 1) -> Sim:
    """A calm cluster with the primary active and its backup in sync."""
    sim = Sim(seed, faults=False, allow_failback=allow_failback).run(until=400)
    assert sim.serving() == [PRIMARY]
    assert member(sim, PRIMARY).backup_in_sync and member(sim, BACKUP).in_sync
    return sim


def member(sim: Sim, name: str) -> Member:
    node = sim.procs[name].node
    assert isinstance(node, Member)
    return node


def test_a_quorum_is_more_than_half_of_the_others() -> None:
    # k voters plus the peer: any two quorums share a voter, so two epochs cannot both win.
    for k in range(1, 8):
        assert 2 * quorum(k) > k + 1
    assert quorum(2) == 2


def test_every_role_has_its_transitions_and_an_unlisted_one_is_an_error() -> None:
    assert set(TRANSITIONS) == set(Role)
    reached = {Role.PASSIVE} | {to for row in TRANSITIONS.values() for to in row.values()}
    assert reached == set(Role)  # every role is reachable from a start
    assert next_role(Role.CANDIDATE, Event.ELECTED) is Role.ACTIVE
    with pytest.raises(BadTransition, match="ELECTED in PASSIVE"):
        next_role(Role.PASSIVE, Event.ELECTED)


def test_a_backup_asks_before_it_stands_and_follows_while_it_asks() -> None:
    sim = started()
    backup = member(sim, BACKUP)
    sim.crash(PRIMARY)
    while backup.role is Role.PASSIVE:
        sim.step()
    # Pre-candidate: it asked whether a quorum would vote, and spent no epoch on asking.
    assert backup.role is Role.PRE_CANDIDATE and backup.role.follows
    assert backup.epoch == 1 and backup.in_sync
    sim.run(until=sim.now + 300)
    assert sim.serving() == [BACKUP] and backup.epoch == 2


def test_a_candidacy_that_gets_no_quorum_in_time_says_why() -> None:
    timing = Timing(heartbeat_interval=20, failure_timeout=100)
    primary = Member(PRIMARY, "", ["node2", "node3"], timing, now=0, primary=True)
    asked = primary.tick(0)  # a fresh primary asks at once
    assert {s.to for s in asked} == {"", "node2", "node3"} and primary.role is Role.PRE_CANDIDATE
    for voter in ("node2", "node3"):
        reply = VoteReply(voter, 1, True, 0, Record(), pre=True)
        stood = primary.receive(reply, now=5)
    assert primary.role is Role.CANDIDATE and {s.message.epoch for s in stood} == {1}
    primary.receive(VoteReply("node2", 1, True, 1, Record()), now=10)
    primary.tick(104)
    assert primary.role is Role.CANDIDATE
    primary.tick(105)
    assert primary.role is Role.PASSIVE and primary.defeat == (
        1,
        "1 of the 2 votes needed (refused by none, no answer from ['node3'])"
        " within failure-timeout (100 ms)",
    )


def test_a_voter_gives_one_vote_per_epoch_and_none_while_it_promised_the_active() -> None:
    timing = Timing(heartbeat_interval=20, failure_timeout=100)
    voter = Voter("node2", timing, now=0)
    hb = Heartbeat(PRIMARY, epoch=1, seq=1, backup=BACKUP, backup_in_sync=True)
    assert voter.on_heartbeat(hb, now=10).accepted
    ask = VoteRequest(BACKUP, epoch=2, data_epoch=1)
    assert not voter.on_vote_request(ask, now=109).granted  # promised the primary until 110
    assert voter.on_vote_request(ask, now=110).granted
    rival = VoteRequest(PRIMARY, epoch=2, data_epoch=1)
    assert not voter.on_vote_request(rival, now=500).granted
    # The old active's heartbeats are refused from now on, and the reply says why.
    reply = voter.on_heartbeat(hb, now=501)
    assert not reply.accepted and reply.known_epoch == 2


def test_a_pre_vote_promises_and_records_nothing() -> None:
    timing = Timing(heartbeat_interval=20, failure_timeout=100)
    voter = Voter("node2", timing, now=0)
    ask = VoteRequest(BACKUP, epoch=1, data_epoch=0, pre=True)
    assert voter.on_vote_request(ask, now=0).granted
    assert voter.ballot.voted == 0 and not voter.changed
    # A real vote at that epoch is still free, for anyone.
    assert voter.on_vote_request(VoteRequest(PRIMARY, 1, 0), now=0).granted


def test_a_restarted_voter_keeps_its_promise_and_its_record() -> None:
    timing = Timing(heartbeat_interval=20, failure_timeout=100)
    voter = Voter("node2", timing, now=0)
    voter.on_heartbeat(Heartbeat(PRIMARY, 1, 1, BACKUP, False), now=0)
    restarted = Voter("node2", timing, now=50, ballot=Ballot(record=voter.ballot.record))
    # It cannot know what it promised before the crash: it waits a whole failure-timeout.
    assert not restarted.on_vote_request(VoteRequest(PRIMARY, 2, 1), now=149).granted
    # The primary announced its backup out of sync: the backup is never elected.
    assert not restarted.on_vote_request(VoteRequest(BACKUP, 2, 1), now=400).granted
    assert restarted.on_vote_request(VoteRequest(PRIMARY, 2, 1), now=400).granted


def test_a_fresh_cluster_starts_with_the_primary_and_a_backup_in_sync() -> None:
    sim = started()
    assert member(sim, PRIMARY).epoch == 1
    assert member(sim, BACKUP).role is Role.PASSIVE
    assert sim.acks > 0


def test_kill_9_of_the_primary_the_backup_takes_over_with_every_acked_binding() -> None:
    sim = started()
    acked = dict(sim.acked)
    sim.crash(PRIMARY)
    sim.run(until=sim.now + 300)
    assert sim.serving() == [BACKUP]
    assert member(sim, BACKUP).epoch == 2
    assert acked.items() <= dict(sim.procs[BACKUP].log).items()


def test_a_backup_synced_by_an_active_it_never_heard_takes_over_when_that_active_dies() -> None:
    """The primary, restarted alone, is elected at epoch 2; its backup comes back with its
    heartbeats cut off (replication's own connection runs), installs epoch 2's snapshot and
    is announced in sync to the voters, and then the primary dies. The backup never heard a
    heartbeat of epoch 2, yet it holds epoch 2's data and the voters know it: it is elected."""
    sim = started()
    sim.crash(BACKUP)
    sim.crash(PRIMARY, restart_in=10)
    sim.run(until=sim.now + 500)
    assert sim.serving() == [PRIMARY] and member(sim, PRIMARY).epoch == 2
    sim.mute(PRIMARY, BACKUP, duration=10_000)
    sim.restart(BACKUP)
    voters = [sim.procs[name].node for name in ("node2", "node3")]
    for _ in range(2_000):
        if all(v.ballot.record.epoch == 2 and v.ballot.record.backup_in_sync for v in voters):
            break
        sim.step()
    else:
        raise AssertionError("the voters never heard the backup announced in sync")
    backup = member(sim, BACKUP)
    assert backup.ballot.record.epoch == 1 and backup.durable.data_epoch == 2
    sim.crash(PRIMARY)
    sim.run(until=sim.now + 600)
    assert sim.serving() == [BACKUP] and backup.epoch == 3


def test_a_snapshot_installed_while_the_backup_stood_in_vain_still_counts() -> None:
    """The backup stood (its heartbeats from the primary lost, replication running); the
    snapshot arrived meanwhile. Its data counts, and once the primary's heartbeats are heard
    again it is in sync with no second snapshot."""
    timing = Timing(heartbeat_interval=20, failure_timeout=100)
    held = Durable(data_epoch=1)  # a copy of epoch 1 from before its restart
    backup = Member(BACKUP, PRIMARY, ["node2", "node3"], timing, 0, primary=False, durable=held)
    backup.receive(Heartbeat(PRIMARY, 1, 1, BACKUP, False), now=0)
    now = 1_000  # the primary's heartbeats stopped reaching it: pre-vote, then stand
    asks = backup.tick(now)
    assert backup.role is Role.PRE_CANDIDATE and asks
    for voter in ("node2", "node3"):
        backup.receive(VoteReply(voter, 2, True, 1, backup.ballot.record, pre=True), now)
    assert backup.role is Role.CANDIDATE
    backup.synced(1)  # a fresh snapshot of the primary of epoch 1 is on disk
    assert not backup.in_sync  # a candidate follows no active
    backup.receive(Heartbeat(PRIMARY, 1, 2, BACKUP, True), now + 1)
    assert backup.role is Role.PASSIVE and backup.in_sync


def test_a_backup_out_of_sync_never_takes_over() -> None:
    sim = started()
    sim.cut(PRIMARY, BACKUP, duration=10_000)
    sim.run(until=sim.now + 300)  # the primary drops its backup, tells the voters, goes on
    assert sim.serving() == [PRIMARY] and not member(sim, PRIMARY).backup_in_sync
    sim.propose("new-group", "node2")
    sim.run(until=sim.now + 20)
    assert sim.acked["new-group"] == "node2"  # acknowledged without the backup
    sim.crash(PRIMARY, restart_in=500)
    sim.run(until=sim.now + 450)
    assert sim.serving() == []  # the backup lacks acknowledged bindings: it must not serve
    assert member(sim, BACKUP).role is not Role.ACTIVE
    sim.run(until=sim.now + 400)
    assert sim.serving() == [PRIMARY]  # the primary holds them all: it comes back


def test_cutting_primary_from_backup_never_activates_the_backup() -> None:
    sim = started()
    sim.cut(PRIMARY, BACKUP, duration=2000)
    for _ in range(400):
        sim.step()
        assert sim.serving() == [PRIMARY]
        assert member(sim, BACKUP).role is not Role.ACTIVE


def test_a_frozen_primary_fences_itself_and_rejoins_as_the_backup() -> None:
    sim = started()
    sim.freeze(PRIMARY, duration=400)
    sim.run(until=sim.now + 300)
    assert sim.serving() == [BACKUP]
    primary = sim.procs[PRIMARY]
    # The moment it wakes up, before it has read a message, its promises have run out.
    sim.run(until=primary.paused_until)
    assert not member(sim, PRIMARY).may_serve(sim.now + primary.offset)
    for _ in range(100):
        sim.step()
        assert sim.serving() == [BACKUP]
    assert member(sim, PRIMARY).role is Role.PASSIVE and member(sim, PRIMARY).in_sync


def test_a_returning_primary_follows_the_active_backup() -> None:
    sim = started()
    sim.crash(PRIMARY, restart_in=300)
    sim.run(until=sim.now + 1000)
    assert sim.serving() == [BACKUP]
    assert member(sim, PRIMARY).in_sync and member(sim, BACKUP).backup_in_sync


def test_failback_hands_node1_back_to_the_primary_at_a_new_epoch() -> None:
    sim = started(allow_failback=True)
    sim.crash(PRIMARY, restart_in=300)
    sim.run(until=sim.now + 250)
    assert sim.serving() == [BACKUP]
    backup_epoch = member(sim, BACKUP).epoch
    sim.run(until=sim.now + 1000)
    assert sim.serving() == [PRIMARY]
    assert member(sim, PRIMARY).epoch > backup_epoch and member(sim, BACKUP).in_sync


def test_a_backup_heard_again_while_replication_held_it_in_sync_is_in_sync_again() -> None:
    # Replication says "in sync" once, over its own connection; the active's heartbeats to the
    # backup may be lost for longer than failure-timeout meanwhile (a restarted backup's channel
    # in reconnect backoff). The active tells the voters it is out of sync then, and must say
    # it is in sync again once it hears the backup, or a failback never starts.
    sim = started()
    sim.mute(PRIMARY, BACKUP, duration=300)
    sim.run(until=sim.now + 250)
    assert sim.serving() == [PRIMARY] and not member(sim, PRIMARY).backup_in_sync
    sim.run(until=sim.now + 300)
    assert sim.procs[PRIMARY].replica_synced  # replication held it in sync all along
    assert member(sim, PRIMARY).backup_in_sync and member(sim, BACKUP).in_sync


def test_kill_9_of_the_backup_the_primary_carries_on_then_the_backup_catches_up() -> None:
    sim = started()
    sim.crash(BACKUP, restart_in=400)
    sim.run(until=sim.now + 300)
    assert sim.serving() == [PRIMARY] and not member(sim, PRIMARY).backup_in_sync
    sim.propose("new-group", "node2")
    sim.run(until=sim.now + 500)
    assert sim.acked["new-group"] == "node2"
    assert member(sim, PRIMARY).backup_in_sync and member(sim, BACKUP).in_sync


def test_a_partition_with_no_majority_anywhere_stops_node1_until_it_heals() -> None:
    sim = started()
    for a, b in [(PRIMARY, BACKUP), (PRIMARY, "node3"), ("node2", BACKUP), ("node2", "node3")]:
        sim.cut(a, b, duration=600)
    sim.run(until=sim.now + 300)
    assert sim.serving() == []  # the primary reaches one voter of three: it fenced itself
    sim.run(until=sim.now + 1000)
    assert len(sim.serving()) == 1


def test_a_seed_replays_exactly() -> None:
    first, second = Sim(77, trace=True).run(), Sim(77, trace=True).run()
    assert first.trace == second.trace and first.trace


def test_the_simulation_catches_a_broken_rule() -> None:
    # A primary that counts on promises for longer than the voters keep them still serves
    # when it wakes up from a freeze, though the backup took over meanwhile.
    sim = started()
    member(sim, PRIMARY).timing = Timing(heartbeat_interval=20, failure_timeout=800)
    sim.run(until=sim.now + 40)
    sim.freeze(PRIMARY, duration=500)
    with pytest.raises(Violation, match="two processes serve node1"):
        sim.run(until=sim.now + 500)


@pytest.mark.slow
def test_two_thousand_random_seeds_keep_node1_single_and_lose_no_binding() -> None:
    activations = unsettled = 0
    for seed in range(SEEDS):
        sim = Sim(seed).run()  # raises Violation, naming the seed, on any broken invariant
        activations += sim.activations
        unsettled += not sim.serving()
    assert activations > 1.3 * SEEDS  # the faults did force failovers
    # After the calm stretch at the end, node1 is served again in (almost) every run.
    assert unsettled < SEEDS // 200, f"{unsettled} runs end with nobody serving node1"


# ---- the shell (cluster/ha.py): real gRPC, the voters' answers slowed down


class _SlowVoter(pb_grpc.ClusterServicer):
    """A cluster member's Failover service whose answer to a vote comes `delay_s` late, as when
    its disk is slow to persist the vote (a voter's event loop waits for that fsync)."""

    def __init__(self, data_dir: Path, delay_s: float) -> None:
        self.registry = VoterRegistry(data_dir)
        self.delay_s = delay_s

    async def Failover(
        self, request: pb.FailoverEnvelope, context: aio.ServicerContext
    ) -> pb.FailoverReplies:
        replies = self.registry.receive(request)
        if request.WhichOneof("message") == "vote_request" and not request.vote_request.pre:
            await asyncio.sleep(self.delay_s)
        return pb.FailoverReplies(replies=replies)


@contextlib.asynccontextmanager
async def elected_primary(tmp_path: Path, vote_delay_s: float) -> AsyncIterator[PairShell]:
    """A fresh primary's PairShell, elected by two voters that answer a vote `vote_delay_s`
    late (real gRPC), stopped with them after."""
    servers, addresses = [], []
    for name in ("node2", "node3"):
        (tmp_path / name).mkdir()
        server = aio.server()
        pb_grpc.add_ClusterServicer_to_server(_SlowVoter(tmp_path / name, vote_delay_s), server)
        address = f"127.0.0.1:{reserve_port()}"
        server.add_insecure_port(address)
        await server.start()
        servers.append(server)
        addresses.append(address)
    config = parse_config(
        yaml.safe_dump(
            {
                "node": {"id": PRIMARY, "data-dir": str(tmp_path / PRIMARY)},
                "listen": {"cluster": f"127.0.0.1:{reserve_port()}"},
                "cluster": {"connectors": addresses},
                "grouping-handler": {"type": "LOCAL"},
                "ha": {"role": "primary", "heartbeat-interval": 200, "failure-timeout": 1000},
            }
        ),
        "node1.yaml",
    )
    (tmp_path / PRIMARY).mkdir()
    elected = asyncio.Event()
    shell = PairShell(config, lambda: elected.set() if shell.may_serve() else None)
    shell.start()
    try:
        await asyncio.wait_for(elected.wait(), timeout=30)
        yield shell
    finally:
        await shell.stop()
        for server in servers:
            await server.stop(None)


async def test_a_fresh_primary_is_elected_at_epoch_1_by_voters_slow_to_persist_their_vote(
    tmp_path: Path,
) -> None:
    """Voters that take 0.6 s to answer a vote (two heartbeat intervals and more: a busy disk
    under a starting compose cluster) still elect a fresh primary at epoch 1. The shell used to
    give up on an answer after two heartbeat intervals: the vote, granted and persisted, was
    lost, the candidacy timed out and every election was repeated at the next epoch."""
    async with elected_primary(tmp_path, 0.6) as shell:
        assert shell.member.defeat is None
        assert shell.epoch == 1


async def test_writes_waiting_to_be_acknowledged_alone_are_once_the_backup_is_in_sync(
    tmp_path: Path,
) -> None:
    """A write no in-sync backup confirmed waits until the voters know the backup is out of
    sync. If the backup comes back in sync first, the voters are told so and will not hear
    otherwise: the write is on the backup by then (tapped before it synced), and is
    acknowledged at once. It used to wait for good, and every delivery behind it (a chaos
    run's node stopped delivering after a takeover)."""
    async with elected_primary(tmp_path, 0.0) as shell:
        shell.backup_synced()
        shell.backup_lost()
        waiting = shell.admit_alone()
        assert waiting is not None and not waiting.done()  # the voters heard "in sync"
        shell.backup_synced()
        await asyncio.wait_for(waiting, 1.0)
