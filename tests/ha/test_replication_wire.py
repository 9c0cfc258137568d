"""The replication stream's own wire format (`cluster/replication_wire.py`): every record
round-trips, the wire's field orders are the store's, a frame of another format (or of before
formats were numbered) is refused, and a backup that follows a real primary through every kind
of write holds what the primary holds; one that meets another format stops following, says so
once, and applies nothing of it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from replication_pair import EPOCH, QUEUE, WAIT_S, Backup, Gate, contents, in_sync, primary, running
from structlog.testing import capture_logs
from waiting import until

from broker import sqlite_file, store_writes
from broker.message import Message
from broker.store_files import STORE_FILE
from broker.store_reads import IndexRun, runs_of
from broker.store_sql import SELECT_INDEX
from broker.store_writes import MessageWrite, QueueDeleted, QueueSaved
from cluster import replica, replication
from cluster import replication_wire as wire
from handler.bindings import BindingsDeleted, BindingsPut
from handler.records import Binding
from pinmq_pb import cluster_pb2 as pb
from pinmq_pb import cluster_pb2_grpc as pb_grpc

# ---- every record, both ways

ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
names = st.text(max_size=20)
stored_messages = st.tuples(
    ints, names, names, names, ints, st.none() | names, ints, ints, st.binary(max_size=64)
)
message_writes = st.builds(
    MessageWrite,
    st.lists(stored_messages, max_size=5),
    st.lists(st.tuples(ints, names), max_size=5),
    st.lists(st.tuples(ints, ints, names), max_size=5),
    st.lists(st.tuples(names, ints), max_size=3),
    st.lists(st.tuples(names, names, st.none() | ints), max_size=3),
)
bindings = st.builds(Binding, names, names, names, ints)
records = st.one_of(
    message_writes,
    st.builds(QueueSaved, names, names, names),
    st.builds(QueueDeleted, names),
    st.builds(BindingsPut, st.lists(bindings, max_size=5).map(tuple)),
    st.builds(BindingsDeleted, st.lists(st.tuples(names, names), max_size=5).map(tuple)),
)
values = st.none() | ints | names | st.binary(max_size=64)


def plain(value: Any) -> Any:
    """A record with every list made a tuple: the decoder hands back tuples."""
    if isinstance(value, list | tuple):
        return tuple(plain(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **fields)
    return value


@given(records)
def test_every_record_round_trips(record: wire.Record) -> None:
    assert plain(wire.decode(wire.encode(record))) == plain(record)


@given(names, names, st.lists(names, min_size=1, max_size=4), st.data())
def test_a_snapshot_chunk_round_trips(file: str, table: str, columns: list[str], data: Any) -> None:
    row = st.tuples(*[values] * len(columns))
    rows = data.draw(st.lists(row, max_size=5))
    chunk = wire.SnapshotChunk(file, table, tuple(columns), rows)
    assert plain(wire.decode_chunk(wire.encode_chunk(chunk))) == plain(chunk)


def test_the_wire_sends_the_store_tuples_in_their_own_order() -> None:
    """Format 1 puts the store's tuples on the wire as they are: the store naming their fields
    otherwise (or in another order) must come with a conversion and a new format."""
    assert wire.FIELDS == {
        "added": store_writes.STORED_MESSAGE,
        "removed": store_writes.MESSAGE_KEY,
        "counts": store_writes.DELIVERY_COUNT,
        "marks": store_writes.MARK,
        "ids": store_writes.DUPLICATE_ID,
    }


# ---- what cannot be read is refused


def test_a_record_of_another_format_is_refused_naming_both() -> None:
    newer = msgpack.packb([wire.FORMAT + 1, 1, [], [], [], [], []])
    with pytest.raises(wire.FormatError) as refused:
        wire.decode(newer)
    assert str(refused.value) == (
        f"the primary sends replication format {wire.FORMAT + 1}, "
        f"this backup reads format {wire.FORMAT}"
    )
    rows = pb.SnapshotRows(file="store", table="meta", rows=msgpack.packb([0, ["key"], []]))
    with pytest.raises(wire.FormatError, match="format 0, this backup reads format 1"):
        wire.decode_chunk(rows)


@pytest.mark.parametrize(
    "payload",
    [
        ([(1, "q", "a", "{}", 0, None, 0, 1, b"m")], [], [], [], []),  # a store write
        ("q", "a", "{}"),  # a queue saved
        "q",  # a queue deleted
        [("g", "q", "node2", 1)],  # bindings put
        [],  # bindings deleted, none
    ],
)
def test_the_request_tuples_of_before_formats_were_numbered_read_as_format_0(
    payload: Any,
) -> None:
    with pytest.raises(wire.FormatError, match="format 0, this backup reads format 1"):
        wire.decode(msgpack.packb(payload, use_bin_type=True))


@pytest.mark.parametrize(
    "payload",
    [
        msgpack.packb([wire.FORMAT, 99, "x"]),  # no such record type
        msgpack.packb([wire.FORMAT, 3]),  # a queue deleted without its queue
        msgpack.packb([wire.FORMAT, 1, [], []]),  # a store write short of fields
        b"\xc1",  # not msgpack
    ],
)
def test_a_malformed_record_is_refused(payload: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.decode(payload)


# ---- a real primary and backup


async def test_a_backup_holds_what_the_primary_holds_after_every_kind_of_write(
    tmp_path: Path,
) -> None:
    gate = Gate(at_once=True)
    async with primary(tmp_path / "primary", gate) as p:
        await p.send(3)
        b = Backup(p.address, tmp_path / "backup")
        async with running(b):
            await in_sync(p, b)
            store = p.store
            shared = {"JMSXGroupID": "g1", "_AMQ_DUPL_ID": "d-1"}
            copies = [
                Message(10, q, QUEUE, b"copy", headers=shared, persistent=True, group="g1")
                for q in (QUEUE, "audit")
            ]
            await store.save_queue("audit", "audit", {"max-consumers": 2})
            await store.write(added=copies, ids=[(QUEUE, "d-1", 10), (QUEUE, "d-0", 1)])
            await store.write(delivered=[copies[0]])
            copies[1].delivery_count = 4
            await store.write(updated=[copies[1]], marks={"node2": 7, "node3": 2})
            await store.write(marks={"node2": 5})  # never lowered
            await store.write(removed=[Message(2, QUEUE, QUEUE, b"", persistent=True)])
            await store.write(ids=[(QUEUE, "d-0", None)])
            await p.bind("g1", "g2")
            await p.unbind("g2")
            await store.save_queue("gone", "gone", {})
            await store.write(added=[Message(11, "gone", "gone", b"x", persistent=True)])
            await store.delete_queue("gone")
            await until("every write on the backup", lambda: b.follower.durable == p.replicator.seq)
            assert gate.lost == 0  # followed throughout
        held = contents(tmp_path / "backup")
        assert held == contents(p.data_dir)
        assert held[f"{STORE_FILE}:marks"] == [("node2", 7), ("node3", 2)]
        assert len(held[f"{STORE_FILE}:messages"]) == 4  # 1, 3 and the two copies of 10
        # The index the backup kept, from the snapshot and every write since, is the one a
        # takeover would scan from its store.
        assert b.follower.index is not None
        conn = sqlite_file.read_only(tmp_path / "backup" / STORE_FILE)
        try:
            scanned = conn.execute(SELECT_INDEX).fetchall()
        finally:
            conn.close()
        assert [row[0] for row in scanned] == [1, 3, 10, 10]
        assert _by_group(b.follower.index.runs()) == _by_group(runs_of(scanned))


def _by_group(runs: list[IndexRun]) -> dict[tuple[str, str | None], tuple[list[int], int]]:
    return {(r.queue, r.group): (r.msg_ids.tolist(), r.enqueued_ns) for r in runs}


class _Newer:
    """The wire of a primary one format ahead: format 1's arrays under the next number."""

    SnapshotChunk = wire.SnapshotChunk

    @staticmethod
    def encode(record: wire.Record) -> bytes:
        _, *data = msgpack.unpackb(wire.encode(record))
        return msgpack.packb([wire.FORMAT + 1, *data], use_bin_type=True)

    @staticmethod
    def encode_chunk(chunk: wire.SnapshotChunk) -> pb.SnapshotRows:
        frame = wire.encode_chunk(chunk)
        _, *data = msgpack.unpackb(frame.rows)
        frame.rows = msgpack.packb([wire.FORMAT + 1, *data], use_bin_type=True)
        return frame


async def test_a_backup_refuses_another_format_stops_following_and_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    streams: list[object] = []

    def stub(channel: Any) -> Any:
        real = pb_grpc.ClusterStub(channel)

        def replicate() -> Any:
            call = real.Replicate()
            streams.append(call)
            return call

        return SimpleNamespace(Replicate=replicate)

    monkeypatch.setattr(replica, "pb_grpc", SimpleNamespace(ClusterStub=stub))
    gate = Gate(at_once=True)
    backup_dir = tmp_path / "backup"
    async with primary(tmp_path / "primary", gate) as p:
        await p.send(3)
        b = Backup(p.address, backup_dir)
        async with running(b):
            await in_sync(p, b)
            held = contents(backup_dir)
            # The primary is replaced by one that writes the next format.
            monkeypatch.setattr(replication, "wire", _Newer)
            with capture_logs() as logged:
                await asyncio.wait_for(p.send(2), WAIT_S)  # acknowledged once the backup is lost
                await until("the backup refused", lambda: b.follower.state == "refused")
                await until("the primary let it go", lambda: p.replicator.backup is None)
                await asyncio.wait_for(p.send(2), WAIT_S)  # the primary goes on alone
            assert b.broken == 1 and gate.lost == 1 and b.synced == [EPOCH]
            assert b.follower.status()["replication"] == "refused"
            assert len(streams) == 1 and p.replicator.backup is None
        refused = [e for e in logged if e["event"].startswith("replication refused")]
        assert len(refused) == 1, logged
        assert refused[0]["log_level"] == "error"
        assert "format 2, this backup reads format 1" in refused[0]["error"]
        assert contents(backup_dir) == held  # nothing of the next format applied
