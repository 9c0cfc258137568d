"""The LOCAL grouping handler over real gRPC on loopback and a real SQLite bindings file, and
`make_handler`. Waits are bounded and nothing asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from grpc import aio
from handler_nodes import WAIT_S, local_node, section, stored_rows
from waiting import until

from broker.config import NodeConfig
from handler.api import (
    Binding,
    RemovalReason,
)
from handler.bindings import BindingStoreError
from handler.factory import make_handler
from handler.local import LocalHandler
from handler.remote import RemoteHandler
from handler.wire import SUBSCRIBED
from pinmq_pb import grouping_pb2 as pb
from pinmq_pb import grouping_pb2_grpc as pb_grpc

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
            await until(
                "the reaped binding deleted from disk",
                lambda: stored_rows(tmp_path / "bindings.db") == [("busy", "orders", "n2", 1)],
            )
            call.cancel()


async def test_by_default_bindings_to_absent_instances_stay_for_as_long_as_they_are_away(
    tmp_path: Path,
) -> None:
    first = LocalHandler(section(timeout=100), "n1", tmp_path)
    await first.start()
    waiting = await first.decide("g1", "orders", "n2")
    await first.stop()

    handler = LocalHandler(section(timeout=100, reaper_period=50), "n1", tmp_path)
    removed: list[tuple[Binding, RemovalReason]] = []
    handler.on_removed(lambda b, r: removed.append((b, r)))
    await handler.start()
    try:
        handler.report_instances({("orders", "n1"): True, ("orders", "n2"): False})
        runs = handler.reaper_runs
        await until(
            "10 reaper runs (5x the handler timeout)", lambda: handler.reaper_runs >= runs + 10
        )
        assert removed == []
        assert await handler.decide("g1", "orders", "n1") == waiting
    finally:
        await handler.stop()


async def test_with_an_absent_timeout_bindings_to_instances_that_do_not_return_are_dropped(
    tmp_path: Path,
) -> None:
    first = LocalHandler(section(timeout=300), "n1", tmp_path)
    await first.start()
    kept = await first.decide("g1", "orders", "n1")
    lost = await first.decide("g2", "orders", "n2")
    await first.stop()

    handler = LocalHandler(
        section(
            timeout=300, reaper_period=60_000, rebind_absent_after=300, lease=100, lease_margin=0
        ),
        "n1",
        tmp_path,
    )
    removed: list[tuple[Binding, RemovalReason]] = []
    handler.on_removed(lambda b, r: removed.append((b, r)))
    await handler.start()
    try:
        handler.instance_seen("orders", "n1", present=True)
        # Meanwhile nothing waits: the restored binding answers.
        assert await handler.decide("g2", "orders", "n3") == lost
        await until("the binding to the missing instance dropped", lambda: removed)
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

    handler = LocalHandler(
        section(
            timeout=200, reaper_period=60_000, rebind_absent_after=200, lease=100, lease_margin=0
        ),
        "n1",
        tmp_path,
    )
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
        await until("absent instances expired", lambda: len(removed) == 3)
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


# ---- wiring ----------------------------------------------------------------------------------


async def test_make_handler_follows_the_config_and_hosts_the_local_service(
    tmp_path: Path,
) -> None:
    def config(extra: dict[str, Any]) -> NodeConfig:
        return NodeConfig.model_validate({"node": {"id": "n1", "data-dir": str(tmp_path)}, **extra})

    hosted: list[Callable[[aio.Server], None]] = []
    assert make_handler(config({}), lambda: None, hosted.append) is None
    remote = make_handler(
        config({"grouping-handler": {"type": "REMOTE", "timeout": 1234}}),
        lambda: None,
        hosted.append,
    )
    assert isinstance(remote, RemoteHandler)
    assert remote.config.timeout == 1234
    assert remote.bindings_store is None
    assert hosted == []  # a REMOTE node serves no grouping service

    local = make_handler(
        config({"grouping-handler": {"type": "LOCAL"}}), lambda: None, hosted.append
    )
    assert isinstance(local, LocalHandler)
    assert local.path == tmp_path / "bindings.db"
    assert len(hosted) == 1
    await local.start()
    server = aio.server()
    try:
        hosted[0](server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        assert local.bindings_store is not None
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.GroupingHandlerStub(channel)
            reply = await stub.Propose(pb.ProposeRequest(group="g", queue="q", node="n2"))
        assert local.cached("g", "q") == Binding("g", "q", "n2", 1)  # the hosted one answered
        assert (reply.node, reply.accepted) == ("n2", True)
    finally:
        await server.stop(None)
        await local.stop()
