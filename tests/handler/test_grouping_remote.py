"""The REMOTE grouping handler against a LOCAL one over real gRPC on loopback: cache, shared
proposals on one stream, removals, refreshes, failures. Waits are bounded and nothing asserts
how long anything took.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from handler_nodes import WAIT_S, CallCounter, local_node, remote_handler, section, stored_rows
from waiting import until

from handler.api import (
    Binding,
    DecisionTimeout,
    HandlerUnavailable,
    RemovalReason,
)
from handler.remote import RemoteHandler

# ---- REMOTE ----------------------------------------------------------------------------------


async def test_remote_miss_proposes_once_then_hits_the_cache(tmp_path: Path) -> None:
    async with (
        local_node(tmp_path) as local,
        remote_handler(lambda: local.address) as remote,
    ):
        assert remote.cached("g1", "orders") is None
        binding = await remote.decide("g1", "orders", "n-remote")
        assert binding == Binding("g1", "orders", "n-remote", 1)
        assert remote.cached("g1", "orders") == binding
        for _ in range(100):
            assert await remote.decide("g1", "orders", "other") == binding
        assert local.proposals == 1
        assert local.handler.cached("g1", "orders") == binding


async def test_concurrent_misses_of_one_key_share_one_call(tmp_path: Path) -> None:
    async with (
        local_node(tmp_path) as local,
        remote_handler(lambda: local.address) as remote,
    ):
        answers = await asyncio.gather(*(remote.decide("g1", "orders", f"n{i}") for i in range(20)))
        assert len(set(answers)) == 1
        assert local.proposals == 1


async def test_two_remotes_proposing_different_nodes_get_the_same_binding(tmp_path: Path) -> None:
    async with (
        local_node(tmp_path) as local,
        remote_handler(lambda: local.address, "n-a") as a,
        remote_handler(lambda: local.address, "n-b") as b,
    ):
        for i in range(20):
            group = f"g{i}"
            from_a, from_b = await asyncio.gather(
                a.decide(group, "orders", "n-a"), b.decide(group, "orders", "n-b")
            )
            assert from_a == from_b
            assert from_a == local.handler.cached(group, "orders")
        assert len(local.handler.arbiter) == 20


async def test_unreachable_local_fails_new_groups_and_keeps_cached_ones(tmp_path: Path) -> None:
    async with (
        local_node(tmp_path) as local,
        remote_handler(lambda: local.address, timeout=300) as remote,
    ):
        pinned = await remote.decide("g1", "orders", "n-remote")
        await local.halt()
        with pytest.raises(DecisionTimeout) as info:
            await remote.decide("g2", "orders", "n-remote")
        message = str(info.value)
        assert message.startswith(
            "no grouping decision for group 'g2' on queue 'orders' within 300 ms: "
            f"the LOCAL grouping handler at {local.address} is unreachable"
        ), message
        assert remote.cached("g1", "orders") == pinned
        assert await remote.decide("g1", "orders", "n-remote") == pinned
        with pytest.raises(HandlerUnavailable):
            await remote.list_bindings()


async def test_concurrent_new_groups_share_one_stream_in_batches(tmp_path: Path) -> None:
    async with (
        local_node(tmp_path) as local,
        remote_handler(lambda: local.address) as remote,
    ):
        groups = [f"g{i}" for i in range(300)]
        answers = await asyncio.gather(*(remote.decide(g, "orders", "n-remote") for g in groups))
        assert answers == [Binding(g, "orders", "n-remote", 1) for g in groups]
        assert stored_rows(local.handler.path) == sorted(
            (g, "orders", "n-remote", 1) for g in groups
        )
        assert local.counter.calls["ProposeStream"] == 1 and local.counter.calls["Propose"] == 0
        assert local.proposals == len(groups)
        assert local.servicer.batches < len(groups)  # proposals travelled together


async def test_a_restarted_local_server_is_reached_on_a_new_stream(tmp_path: Path) -> None:
    async with (
        local_node(tmp_path) as local,
        remote_handler(lambda: local.address, timeout=5000) as remote,
    ):
        assert (await remote.decide("g1", "orders", "n-remote")).node == "n-remote"
        await local.halt()
        await local.serve()  # same port: the old stream is broken, the channel reconnects
        assert (await remote.decide("g2", "orders", "n-remote")).node == "n-remote"
        assert local.counter.calls["ProposeStream"] == 2


async def test_a_proposal_the_local_node_cannot_decide_fails_with_its_reason(
    tmp_path: Path,
) -> None:
    async with (
        local_node(tmp_path) as local,
        remote_handler(lambda: local.address, timeout=300) as remote,
    ):
        await until("the remote learnt that leases are off", lambda: remote.lease.until is None)
        await local.handler.stop()  # still served, but its bindings file is closed
        with pytest.raises(DecisionTimeout) as info:
            await remote.decide("g", "orders", "n-remote")
        assert str(info.value) == (
            "no grouping decision for group 'g' on queue 'orders' within 300 ms: the LOCAL "
            f"grouping handler at {local.address}: the LOCAL grouping handler is not running"
        )
        assert local.proposals >= 1


async def test_answers_of_an_arbiter_older_than_the_newest_heard_are_ignored(
    tmp_path: Path,
) -> None:
    """An ha pair's fenced arbiter (epoch 1) that still answers for a moment after its
    successor (epoch 2) was heard from decides nothing: the proposal fails naming why."""
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    async with (
        local_node(tmp_path / "old", epoch=1) as old,
        local_node(tmp_path / "new", epoch=2) as new,
    ):
        target = [new.address]
        # Long enough for a first answer (a connection, a stream, a durable binding) and for
        # one of the old arbiter on a loaded machine (CI saw 1.5 s pass without the first):
        # the message names the last answer heard, not the attempt the deadline cut short.
        async with remote_handler(lambda: target[0], timeout=5000) as remote:
            assert await remote.decide("g1", "orders", "n-remote") == Binding(
                "g1", "orders", "n-remote", 2
            )
            assert remote.arbiter_epoch == 2
            target[0] = old.address
            with pytest.raises(DecisionTimeout) as info:
                await remote.decide("g2", "orders", "n-remote")
            assert f"at {old.address} answered at arbiter epoch 1, older than epoch 2" in str(
                info.value
            )
            assert old.proposals >= 1 and remote.cached("g2", "orders") is None
            await until("old removals refused", lambda: not remote.subscribed.is_set())
            target[0] = new.address
            assert (await remote.decide("g2", "orders", "n-remote")).epoch == 2
            await until("subscribed to the new arbiter", remote.subscribed.is_set)


async def test_no_known_local_node_times_out_with_a_clear_message() -> None:
    async with remote_handler(lambda: None, timeout=200) as remote:
        with pytest.raises(DecisionTimeout, match=r"^no grouping decision for group 'g' on queue"):
            await remote.decide("g", "orders", "n-remote")
        with pytest.raises(DecisionTimeout, match="no LOCAL grouping handler is known"):
            await remote.decide("g", "orders", "n-remote")


async def test_a_decision_waits_for_the_local_node_to_become_known(tmp_path: Path) -> None:
    known: list[str] = []
    asked = [0]  # how often the handler looked for the LOCAL node

    def locate() -> str | None:
        asked[0] += 1
        return known[0] if known else None

    async with (
        local_node(tmp_path) as local,
        remote_handler(locate, timeout=5000) as remote,
    ):
        before = asked[0]
        pending = asyncio.ensure_future(remote.decide("g", "orders", "n-remote"))
        await until("the decision to look for the LOCAL node in vain", lambda: asked[0] > before)
        assert not pending.done()
        known.append(local.address)
        async with asyncio.timeout(WAIT_S):
            assert (await pending).node == "n-remote"


async def test_removals_evict_cache_entries_and_call_back(tmp_path: Path) -> None:
    async with (
        local_node(tmp_path) as local,
        remote_handler(lambda: local.address) as remote,
    ):
        removed: list[tuple[Binding, RemovalReason]] = []
        remote.on_removed(lambda b, r: removed.append((b, r)))
        await asyncio.wait_for(remote.subscribed.wait(), WAIT_S)
        first = await remote.decide("g1", "orders", "n2")
        second = await remote.decide("g2", "orders", "n3")
        assert await local.handler.unbind("g1") == 1
        await until("g1 evicted", lambda: remote.cached("g1", "orders") is None)
        local.handler.instance_deleted("orders", "n3")
        await until("g2 evicted", lambda: remote.cached("g2", "orders") is None)
        assert removed == [
            (first, RemovalReason.UNBOUND),
            (second, RemovalReason.INSTANCE_DELETED),
        ]
        rebound = await remote.decide("g1", "orders", "n4")
        assert rebound.node == "n4"


async def test_removals_follow_the_local_node_to_a_new_address(tmp_path: Path) -> None:
    """After a failover the LOCAL node answers at another address (the backup's): the removal
    stream moves there too, so removals made by the new arbiter still evict the cache."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with local_node(tmp_path / "a") as first, local_node(tmp_path / "b") as second:
        target = [first.address]
        async with remote_handler(lambda: target[0]) as remote:
            await asyncio.wait_for(remote.subscribed.wait(), WAIT_S)
            target[0] = second.address
            binding = await remote.decide("g1", "orders", "n2")  # asks the new address
            await until(
                "subscribed at the new one",
                lambda: second.handler.subscribers == ["n-remote"],
            )
            removed: list[tuple[Binding, RemovalReason]] = []
            remote.on_removed(lambda b, r: removed.append((b, r)))
            assert await second.handler.unbind("g1") == 1
            await until("g1 evicted", lambda: remote.cached("g1", "orders") is None)
            assert removed == [(binding, RemovalReason.UNBOUND)]


async def test_removals_missed_while_disconnected_are_found_on_reconnect(tmp_path: Path) -> None:
    async with (
        local_node(tmp_path) as local,
        remote_handler(lambda: local.address) as remote,
    ):
        removed: list[tuple[Binding, RemovalReason]] = []
        remote.on_removed(lambda b, r: removed.append((b, r)))
        gone = await remote.decide("g1", "orders", "n2")
        kept = await remote.decide("g2", "orders", "n2")
        await asyncio.wait_for(remote.subscribed.wait(), WAIT_S)
        await local.halt()
        await until("the stream noticed", lambda: not remote.subscribed.is_set())
        await local.handler.unbind("g1", "orders")  # nobody is subscribed to hear it
        await local.serve()  # same port
        await until("stale entry dropped", lambda: remote.cached("g1", "orders") is None)
        assert removed == [(gone, RemovalReason.STALE)]
        assert remote.cached("g2", "orders") == kept


async def test_hits_refresh_last_use_in_batches_not_per_decide(tmp_path: Path) -> None:
    async with (
        local_node(tmp_path, group_timeout=400, reaper_period=60_000) as local,
        remote_handler(lambda: local.address, group_timeout=400) as remote,
    ):
        await asyncio.wait_for(remote.subscribed.wait(), WAIT_S)
        binding = await remote.decide("g1", "orders", "n2")
        first_use = local.last_use("g1", "orders")
        assert first_use is not None
        decides = 0
        while local.last_use("g1", "orders") == first_use:
            for _ in range(50):
                assert await remote.decide("g1", "orders", "n2") == binding
                assert remote.cached("g1", "orders") == binding
                decides += 2
            await asyncio.sleep(0.02)
            assert decides < 1_000_000, "last use never refreshed"
        assert local.last_use("g1", "orders") > first_use
        assert local.counter.calls["Touch"] >= 1
        assert local.counter.calls["Touch"] < decides / 50
        assert local.proposals == 1


class _SlowTouch(CallCounter):
    """Holds every Touch call for a while, so one is in flight when the channel closes."""

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        if details.method.endswith("/Touch"):
            await asyncio.sleep(5)
        return await super().intercept_service(continuation, details)


@pytest.mark.slow
async def test_refreshes_go_on_at_a_new_local_address_after_a_touch_was_cut_off(
    tmp_path: Path,
) -> None:
    """A Touch in flight when the LOCAL node moves (its channel closed) must not end the
    refreshing: the new arbiter would reap bindings still in use."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with (
        local_node(tmp_path / "a", group_timeout=400) as first,
        local_node(tmp_path / "b", group_timeout=400, reaper_period=60_000) as second,
    ):
        await first.halt()
        first.counter = _SlowTouch()
        await first.serve()
        target = [first.address]
        async with remote_handler(lambda: target[0], group_timeout=400) as remote:
            await remote.decide("g1", "orders", "n2")
            while first.counter.calls["Touch"] == 0:  # one Touch is held at `first`
                await remote.decide("g1", "orders", "n2")
                await asyncio.sleep(0.02)
            target[0] = second.address
            await remote.decide("g2", "orders", "n2")  # moves: `first`'s channel closes
            used = second.last_use("g2", "orders")

            async def refreshed() -> bool:
                await remote.decide("g2", "orders", "n2")
                return second.last_use("g2", "orders") != used

            deadline = asyncio.get_running_loop().time() + WAIT_S
            while not await refreshed():
                assert asyncio.get_running_loop().time() < deadline, "refreshing stopped"
                await asyncio.sleep(0.05)


async def test_remote_lists_and_unbinds_through_the_local_node(tmp_path: Path) -> None:
    async with (
        local_node(tmp_path) as local,
        remote_handler(lambda: local.address) as remote,
    ):
        await remote.decide("g1", "orders", "n2")
        await remote.decide("g1", "invoices", "n3")
        await remote.decide("g2", "orders", "n2")
        listed = await remote.list_bindings()
        assert {u.binding.key for u in listed} == {
            ("g1", "orders"),
            ("g1", "invoices"),
            ("g2", "orders"),
        }
        assert all(u.last_use_unix_ms > 1_600_000_000_000 for u in listed)
        assert [u.binding.key for u in await remote.list_bindings("g2")] == [("g2", "orders")]
        assert len(await remote.list_bindings(limit=2)) == 2
        assert await remote.unbind("g1", "invoices") == 1
        assert await remote.unbind("g1") == 1
        assert await remote.unbind("g1") == 0
        assert [b.key for b, _ in local.handler.arbiter.bindings()] == [("g2", "orders")]


async def test_a_remote_that_unbinds_a_group_asks_again_before_its_removal_arrives(
    tmp_path: Path,
) -> None:
    # The removals stream is not subscribed (never started): only unbind's own answer can
    # make the next decision of the group on this node ask the LOCAL node again. Nor does
    # its lease keeper run: one call learns that leases are off.
    async with local_node(tmp_path) as local:
        remote = RemoteHandler(lambda: local.address, section("REMOTE"), "n2")
        try:
            await remote.lease.renew()
            assert await remote.decide("g1", "orders", "n2") == Binding("g1", "orders", "n2", 1)
            await remote.decide("g1", "invoices", "n2")
            assert await remote.unbind("g1", "orders") == 1
            assert remote.cached("g1", "orders") is None
            assert remote.cached("g1", "invoices") is not None  # another queue: still bound
            rebound = await remote.decide("g1", "orders", "n3")
            assert rebound.node == "n3" and local.handler.cached("g1", "orders") == rebound
        finally:
            await remote.stop()
