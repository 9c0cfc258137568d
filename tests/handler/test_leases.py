"""Leases for partition-safe re-binding: the arbiter's table (pure), the LOCAL reaper that waits
for a lease to run out before moving a node's groups, and a REMOTE node that gets, renews and
loses its lease over real gRPC. The clocks the decisions read are passed in where a test must
say what time it is; waits are bounded and no test asserts how long anything took.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from handler_nodes import local_node, remote_handler, section
from waiting import until

from handler.api import Binding, DecisionTimeout, RemovalReason
from handler.arbiter import Arbiter
from handler.leases import RATE_DRIFT, Leases
from handler.local import LocalHandler

MS = 1_000_000

# ---- the arbiter's table -----------------------------------------------------------------------


def test_a_lease_holds_on_the_arbiter_for_lease_plus_rate_drift_plus_margin() -> None:
    leases = Leases(1000, 200, started_ns=0)
    bound = int(1000 * MS * (1 + RATE_DRIFT)) + 200 * MS
    assert leases.bound_ns == bound == 1210 * MS
    t = 60_000 * MS
    assert leases.grant("n2", t) == 1000  # what the node is told: the lease itself
    assert leases.holds("n2", t + bound - 1)
    assert not leases.holds("n2", t + bound)
    assert leases.next_expiry(t) == t + bound
    assert leases.next_expiry(t + bound) is None


def test_a_new_arbiter_counts_every_node_as_leased_for_a_whole_bound_after_its_start() -> None:
    """It cannot know what its predecessor granted (a restart, an ha takeover)."""
    started = 5_000 * MS
    leases = Leases(1000, 0, started_ns=started)
    assert leases.holds("never-heard-of", started + leases.bound_ns - 1)
    assert not leases.holds("never-heard-of", started + leases.bound_ns)
    assert leases.next_expiry(started) == started + leases.bound_ns
    # A grant made at the start runs from then: never shorter than the floor.
    leases.grant("n2", started)
    assert leases.holds("n2", started + leases.bound_ns - 1)


def test_a_renewal_extends_a_lease_and_an_earlier_reading_never_shortens_it() -> None:
    leases = Leases(1000, 0, started_ns=0)
    leases.grant("n2", 10_000 * MS)
    leases.grant("n2", 9_000 * MS)
    assert leases.holds("n2", 10_000 * MS + leases.bound_ns - 1)


def test_the_arbiter_leaves_absent_instances_of_leased_nodes_bound() -> None:
    arbiter = Arbiter(1, -1, 100)
    cut, gone = arbiter.propose("g1", "q", "n2", 0)[0], arbiter.propose("g2", "q", "n3", 0)[0]
    arbiter.instance_seen("q", "n2", False, 0)
    arbiter.instance_seen("q", "n3", False, 0)
    assert arbiter.absent_nodes() == {"n2", "n3"}
    assert arbiter.next_absent_expiry(leased={"n2"}) == 100 * MS + 1
    assert arbiter.expire_absent(200 * MS, leased={"n2"}) == [gone]
    assert arbiter.next_absent_expiry(leased={"n2"}) is None
    assert arbiter.expire_absent(300 * MS) == [cut]
    assert arbiter.absent_nodes() == set()


# ---- the LOCAL handler -------------------------------------------------------------------------


async def test_without_rebind_absent_after_no_lease_is_granted(tmp_path: Path) -> None:
    handler = LocalHandler(section(), "n1", tmp_path)
    await handler.start()
    try:
        assert handler.grant_lease("n2") == 0
        assert handler.leases is None
    finally:
        await handler.stop()


async def test_the_reaper_moves_an_absent_nodes_groups_only_once_its_lease_has_run_out(
    tmp_path: Path,
) -> None:
    now = [0]
    handler = LocalHandler(
        section(rebind_absent_after=50, lease=1000, lease_margin=0, reaper_period=60_000),
        "n1",
        tmp_path,
        lease_clock=lambda: now[0],
    )
    removed: list[tuple[Binding, RemovalReason]] = []
    handler.on_removed(lambda b, r: removed.append((b, r)))
    await handler.start()
    try:
        assert handler.leases is not None
        bound = handler.leases.bound_ns
        cut = await handler.decide("g1", "orders", "n2")
        now[0] = 500 * MS
        assert handler.grant_lease("n2") == 1000
        handler.instance_seen("orders", "n2", present=False)
        # Absent for far longer than rebind-absent-after (real time), but its lease holds
        # (the lease clock stands still): the binding stays.
        await asyncio.sleep(0.3)
        assert removed == [] and handler.cached("g1", "orders") == cut
        now[0] = 500 * MS + bound - 1
        handler.instance_seen("orders", "n2", present=False)  # wakes the reaper
        await asyncio.sleep(0.1)
        assert removed == []
        now[0] = 500 * MS + bound
        handler.instance_seen("orders", "n2", present=False)
        await until("the binding moved off once the lease ran out", lambda: removed)
        assert removed == [(cut, RemovalReason.INSTANCE_ABSENT)]
        assert await handler.decide("g1", "orders", "n3") == Binding("g1", "orders", "n3", 1)
    finally:
        await handler.stop()


# ---- a REMOTE node -----------------------------------------------------------------------------


async def test_with_leases_off_a_remote_delivers_without_one_and_keeps_its_cache(
    tmp_path: Path,
) -> None:
    async with (
        local_node(tmp_path) as local,
        remote_handler(lambda: local.address, timeout=300) as remote,
    ):
        pinned = await remote.decide("g1", "orders", "n-remote")
        assert remote.lease.until is None and remote.lease.holds()
        await local.halt()
        await asyncio.sleep(0.3)
        assert remote.lease.holds() and remote.lease.lapses == 0
        assert remote.cached("g1", "orders") == pinned


async def test_a_remote_that_loses_its_lease_forgets_its_bindings_until_it_holds_one_again(
    tmp_path: Path,
) -> None:
    async with (
        local_node(tmp_path, rebind_absent_after=60_000, lease=300, lease_margin=0) as local,
        remote_handler(lambda: local.address, timeout=300) as remote,
    ):
        lapsed: list[bool] = []
        remote.on_lease_lapsed(lambda: lapsed.append(remote.lease.holds()))
        pinned = await remote.decide("g1", "orders", "n-remote")
        assert remote.lease.lease_ms == 300 and remote.lease.holds()
        assert remote.cached("g1", "orders") == pinned
        await local.halt()  # the LOCAL node is cut off: no renewal reaches it
        await until("the lease lapsed", lambda: lapsed)
        assert lapsed == [False] and remote.lease.lapses == 1
        assert remote.cached("g1", "orders") is None  # forgotten: asked again once it holds
        with pytest.raises(DecisionTimeout) as info:
            await remote.decide("g1", "orders", "n-remote")
        assert "holds no lease from the LOCAL grouping handler" in str(info.value)
        assert f"asked at {local.address}: UNAVAILABLE" in str(info.value)  # why not
        await local.serve()
        await until("the lease held again", remote.lease.holds)
        assert await remote.decide("g1", "orders", "other") == pinned
        assert remote.lease.lapses == 1


async def test_a_lease_from_an_arbiter_older_than_the_newest_heard_does_not_count(
    tmp_path: Path,
) -> None:
    """An ha pair's fenced arbiter that still answers cannot keep a node's lease alive."""
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    leases = {"rebind_absent_after": 60_000, "lease": 300, "lease_margin": 0}
    async with (
        local_node(tmp_path / "old", epoch=1, **leases) as old,
        local_node(tmp_path / "new", epoch=2, **leases) as new,
    ):
        target = [new.address]
        async with remote_handler(lambda: target[0], timeout=300) as remote:
            lapsed: list[bool] = []
            remote.on_lease_lapsed(lambda: lapsed.append(True))
            await until("a lease from the new arbiter", remote.lease.holds)
            assert remote.arbiter_epoch == 2
            target[0] = old.address  # only the fenced arbiter answers now
            await until("the lease lapsed", lambda: lapsed)
            assert remote.lease.failure == "answered by an arbiter of an older epoch (1)"
            target[0] = new.address
            await until("the lease held again", remote.lease.holds)
            assert remote.lease.lapses == 1
