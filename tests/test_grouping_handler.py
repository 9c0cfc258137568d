"""LOCAL and REMOTE grouping handlers over real gRPC on loopback and real SQLite files.

The LOCAL handler's service is hosted on an in-process `grpc.aio` server, as the cluster's
server hosts it on a node; an interceptor counts the calls that reach it. Waits are bounded
and nothing asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from grpc import aio

from broker.config import GroupingHandlerSection, NodeConfig
from handler.api import (
    Binding,
    DecisionTimeout,
    HandlerUnavailable,
    RemovalReason,
)
from handler.bindings import BindingStoreError
from handler.factory import make_handler
from handler.local import SUBSCRIBED, LocalHandler
from handler.remote import RemoteHandler
from pinmq_pb import grouping_pb2 as pb
from pinmq_pb import grouping_pb2_grpc as pb_grpc

WAIT_S = 10.0


def section(kind: str = "LOCAL", **settings: Any) -> GroupingHandlerSection:
    return GroupingHandlerSection(type=kind, **settings)


async def wait_until(predicate: Callable[[], object], what: str) -> None:
    """Poll until `predicate()` is true; fail after WAIT_S naming what never happened."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"not within {WAIT_S}s: {what}")
        await asyncio.sleep(0.01)


class CallCounter(aio.ServerInterceptor):
    """Counts the RPCs that reach the server, by method name."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        self.calls[details.method.rsplit("/", 1)[-1]] += 1
        return await continuation(details)


class LocalNode:
    """A LocalHandler served on a loopback port; the server can be stopped and restarted."""

    def __init__(self, handler: LocalHandler) -> None:
        self.handler = handler
        self.counter = CallCounter()
        self.port = 0
        self.server: aio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def serve(self) -> None:
        self.server = aio.server(interceptors=[self.counter])
        self.handler.add_to_server(self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        await self.server.start()

    async def halt(self) -> None:
        if self.server is not None:
            await self.server.stop(None)
            self.server = None

    @property
    def proposals(self) -> int:
        """Proposals that reached this server, by Propose or ProposeStream."""
        assert self.handler.servicer is not None
        return self.handler.servicer.proposals

    def last_use(self, group: str, queue: str) -> int | None:
        for b, last_use in self.handler.arbiter.bindings():
            if b.key == (group, queue):
                return last_use
        return None


@asynccontextmanager
async def local_node(data_dir: Path, **settings: Any) -> AsyncIterator[LocalNode]:
    handler = LocalHandler(section("LOCAL", **settings), "n-local", data_dir)
    await handler.start()
    node = LocalNode(handler)
    await node.serve()
    try:
        yield node
    finally:
        await node.halt()
        await handler.stop()


@asynccontextmanager
async def remote_handler(
    locate: Callable[[], str | None], node_id: str = "n-remote", **settings: Any
) -> AsyncIterator[RemoteHandler]:
    remote = RemoteHandler(locate, section("REMOTE", **settings), node_id, reconnect_interval_ms=50)
    await remote.start()
    try:
        yield remote
    finally:
        await remote.stop()


def stored_rows(path: Path) -> list[tuple[str, str, str, int]]:
    conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    try:
        return conn.execute("SELECT grp, queue, node, epoch FROM bindings ORDER BY grp").fetchall()
    finally:
        conn.close()


# ---- LOCAL -----------------------------------------------------------------------------------


async def test_local_decision_is_on_disk_when_it_is_answered(tmp_path: Path) -> None:
    handler = LocalHandler(section(), "n1", tmp_path)
    await handler.start()
    try:
        assert handler.cached("g1", "orders") is None
        binding = await handler.decide("g1", "orders", "n2")
        assert binding == Binding("g1", "orders", "n2", 1)
        assert stored_rows(tmp_path / "bindings.db") == [("g1", "orders", "n2", 1)]
        assert await handler.decide("g1", "orders", "n3") == binding
        assert handler.cached("g1", "orders") == binding
    finally:
        await handler.stop()

    again = LocalHandler(section(), "n1", tmp_path)
    await again.start()
    try:
        assert again.cached("g1", "orders") == binding
        assert await again.decide("g1", "orders", "n3") == binding
    finally:
        await again.stop()


async def test_local_concurrent_proposals_get_one_durable_binding(tmp_path: Path) -> None:
    handler = LocalHandler(section(), "n1", tmp_path)
    await handler.start()
    try:
        answers = await asyncio.gather(
            *(handler.decide("g", "orders", f"n{i}") for i in range(10)),
            *(handler.decide(f"g{i}", "orders", "n1") for i in range(50)),
        )
        assert len({answers[i] for i in range(10)}) == 1
        assert len(stored_rows(tmp_path / "bindings.db")) == 51
    finally:
        await handler.stop()


async def test_a_corrupt_bindings_file_is_refused_and_named(tmp_path: Path) -> None:
    path = tmp_path / "bindings.db"
    path.write_bytes(b"this is not a database, it is a note" * 10)
    handler = LocalHandler(section(), "n1", tmp_path)
    with pytest.raises(BindingStoreError, match=re.escape(f"{path}: not a SQLite database")):
        await handler.start()
    assert path.read_bytes() == b"this is not a database, it is a note" * 10


async def test_a_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bindings.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(BindingStoreError, match="not a pinmq bindings file"):
        await LocalHandler(section(), "n1", tmp_path).start()


async def test_reaper_removes_idle_bindings_and_tells_subscribers(tmp_path: Path) -> None:
    async with local_node(tmp_path, group_timeout=300, reaper_period=50) as local:
        removed: list[tuple[Binding, RemovalReason]] = []
        local.handler.on_removed(lambda b, r: removed.append((b, r)))
        async with aio.insecure_channel(local.address) as channel:
            call = pb_grpc.GroupingHandlerStub(channel).Removals(pb.RemovalsRequest(node="t"))
            metadata = await call.initial_metadata()
            assert metadata.get(SUBSCRIBED[0]) == SUBSCRIBED[1]
            idle = await local.handler.decide("idle", "orders", "n2")
            busy = await local.handler.decide("busy", "orders", "n2")
            deadline = asyncio.get_running_loop().time() + WAIT_S
            while not removed:  # keep one binding in use until the other is reaped
                assert local.handler.cached("busy", "orders") == busy
                await asyncio.sleep(0.02)
                assert asyncio.get_running_loop().time() < deadline, "nothing reaped"
            assert removed == [(idle, RemovalReason.REAPED)]
            async with asyncio.timeout(WAIT_S):
                message = await anext(aiter(call))
            assert (message.group, message.queue, message.node, message.reason) == (
                "idle",
                "orders",
                "n2",
                pb.REASON_REAPED,
            )
            assert local.handler.cached("busy", "orders") == busy
            await wait_until(
                lambda: stored_rows(tmp_path / "bindings.db") == [("busy", "orders", "n2", 1)],
                "the reaped binding deleted from disk",
            )
            call.cancel()


async def test_after_a_restart_bindings_to_instances_that_do_not_return_are_dropped(
    tmp_path: Path,
) -> None:
    first = LocalHandler(section(timeout=300), "n1", tmp_path)
    await first.start()
    kept = await first.decide("g1", "orders", "n1")
    lost = await first.decide("g2", "orders", "n2")
    await first.stop()

    handler = LocalHandler(section(timeout=300, reaper_period=60_000), "n1", tmp_path)
    removed: list[tuple[Binding, RemovalReason]] = []
    handler.on_removed(lambda b, r: removed.append((b, r)))
    await handler.start()
    try:
        handler.instance_seen("orders", "n1", present=True)
        # Meanwhile nothing waits: the restored binding answers.
        assert await handler.decide("g2", "orders", "n3") == lost
        await wait_until(lambda: removed, "the binding to the missing instance dropped")
        assert removed == [(lost, RemovalReason.INSTANCE_ABSENT)]
        assert handler.cached("g1", "orders") == kept
        assert await handler.decide("g2", "orders", "n3") == Binding("g2", "orders", "n3", 1)
    finally:
        await handler.stop()


async def test_deleted_instance_loses_its_bindings(tmp_path: Path) -> None:
    handler = LocalHandler(section(), "n1", tmp_path)
    removed: list[tuple[Binding, RemovalReason]] = []
    handler.on_removed(lambda b, r: removed.append((b, r)))
    await handler.start()
    try:
        gone = await handler.decide("g1", "orders", "n2")
        stays = await handler.decide("g2", "orders", "n1")
        handler.instance_deleted("orders", "n2")
        assert removed == [(gone, RemovalReason.INSTANCE_DELETED)]
        assert handler.cached("g1", "orders") is None
        assert handler.cached("g2", "orders") == stays
    finally:
        await handler.stop()


async def test_topology_snapshots_mark_instances_present_absent_or_deleted(
    tmp_path: Path,
) -> None:
    first = LocalHandler(section(), "n1", tmp_path)
    await first.start()
    restored = await first.decide("g0", "orders", "n9")  # its node is not heard of below
    await first.stop()

    handler = LocalHandler(section(timeout=200, reaper_period=60_000), "n1", tmp_path)
    removed: list[tuple[Binding, RemovalReason]] = []
    handler.on_removed(lambda b, r: removed.append((b, r)))
    await handler.start()
    try:
        deleted = await handler.decide("g1", "orders", "n2")
        down = await handler.decide("g2", "orders", "n3")
        up = await handler.decide("g3", "orders", "n1")
        handler.report_instances({("orders", "n1"): True, ("orders", "n2"): True})
        handler.report_instances({("orders", "n1"): True, ("orders", "n3"): False})
        assert removed == [(deleted, RemovalReason.INSTANCE_DELETED)]
        await wait_until(lambda: len(removed) == 3, "absent instances expired")
        assert sorted(removed[1:], key=lambda r: r[0].group) == [
            (restored, RemovalReason.INSTANCE_ABSENT),
            (down, RemovalReason.INSTANCE_ABSENT),
        ]
        assert handler.cached("g3", "orders") == up
    finally:
        await handler.stop()


async def test_propose_rejects_empty_fields(tmp_path: Path) -> None:
    async with (
        local_node(tmp_path) as local,
        aio.insecure_channel(local.address) as channel,
    ):
        stub = pb_grpc.GroupingHandlerStub(channel)
        with pytest.raises(aio.AioRpcError, match="must not be empty"):
            await stub.Propose(pb.ProposeRequest(group="g", queue="q"))
        reply = await stub.Propose(pb.ProposeRequest(group="g", queue="q", node="n2"))
        assert (reply.node, reply.epoch, reply.accepted) == ("n2", 1, True)
        reply = await stub.Propose(pb.ProposeRequest(group="g", queue="q", node="n3"))
        assert (reply.node, reply.accepted) == ("n2", False)


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
        assert local.handler.servicer is not None
        assert local.handler.servicer.batches < len(groups)  # proposals travelled together


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
        await local.handler.stop()  # still served, but its bindings file is closed
        with pytest.raises(DecisionTimeout) as info:
            await remote.decide("g", "orders", "n-remote")
        assert str(info.value) == (
            "no grouping decision for group 'g' on queue 'orders' within 300 ms: the LOCAL "
            f"grouping handler at {local.address}: the LOCAL grouping handler is not running"
        )
        assert local.proposals >= 1


async def test_no_known_local_node_times_out_with_a_clear_message() -> None:
    async with remote_handler(lambda: None, timeout=200) as remote:
        with pytest.raises(DecisionTimeout, match=r"^no grouping decision for group 'g' on queue"):
            await remote.decide("g", "orders", "n-remote")
        with pytest.raises(DecisionTimeout, match="no LOCAL grouping handler is known"):
            await remote.decide("g", "orders", "n-remote")


async def test_a_decision_waits_for_the_local_node_to_become_known(tmp_path: Path) -> None:
    known: list[str] = []
    async with (
        local_node(tmp_path) as local,
        remote_handler(lambda: known[0] if known else None, timeout=5000) as remote,
    ):
        pending = asyncio.ensure_future(remote.decide("g", "orders", "n-remote"))
        await asyncio.sleep(0.1)
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
        await wait_until(lambda: remote.cached("g1", "orders") is None, "g1 evicted")
        local.handler.instance_deleted("orders", "n3")
        await wait_until(lambda: remote.cached("g2", "orders") is None, "g2 evicted")
        assert removed == [
            (first, RemovalReason.UNBOUND),
            (second, RemovalReason.INSTANCE_DELETED),
        ]
        rebound = await remote.decide("g1", "orders", "n4")
        assert rebound.node == "n4"


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
        await wait_until(lambda: not remote.subscribed.is_set(), "the stream noticed")
        await local.handler.unbind("g1", "orders")  # nobody is subscribed to hear it
        await local.serve()  # same port
        await wait_until(lambda: remote.cached("g1", "orders") is None, "stale entry dropped")
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


# ---- wiring ----------------------------------------------------------------------------------


async def test_make_handler_follows_the_config(tmp_path: Path) -> None:
    def config(extra: dict[str, Any]) -> NodeConfig:
        return NodeConfig.model_validate({"node": {"id": "n1", "data-dir": str(tmp_path)}, **extra})

    assert make_handler(config({}), lambda: None) is None
    local = make_handler(config({"grouping-handler": {"type": "LOCAL"}}), lambda: None)
    assert isinstance(local, LocalHandler)
    assert local.path == tmp_path / "bindings.db"
    remote = make_handler(
        config({"grouping-handler": {"type": "REMOTE", "timeout": 1234}}), lambda: None
    )
    assert isinstance(remote, RemoteHandler)
    assert remote.config.timeout == 1234
