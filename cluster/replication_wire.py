"""The replication stream's own wire format (ha): what the primary's stores write, as its
backup reads it, versioned.

The primary's two files hand replication one write record per call (`broker/store_writes.py`,
`handler/bindings.py`); this module alone says how each crosses the wire, so that a change to
a store's records cannot change the stream unnoticed. Each record type has a tag and one
function that encodes it and one that decodes it; each record goes in the `payload` of a
`ReplicatedOp` (whose `file` says which file applies it), and each snapshot chunk, rows of one
table of one file, in the `rows` of a `SnapshotRows` with its column names. Both are one
msgpack array that starts with `FORMAT`: `[FORMAT, tag, fields...]`, `[FORMAT, columns, rows]`.

A backup reads only its own `FORMAT`: anything else is refused with `FormatError`, naming both
formats, before any of it is applied (`cluster/replica.py` then stops following). The stores'
request tuples that the stream carried before formats were numbered read as format 0.

Format 1, record by record (its fields in this order; `FIELDS`: the fields of each tuple):
- 1 `MessageWrite`: added `StoredMessage`s, removed `MessageKey`s, `DeliveryCount`s, `Mark`s,
  `DuplicateId`s;
- 2 `QueueSaved`: queue, address, settings (JSON); 3 `QueueDeleted`: queue;
- 4 `BindingsPut`: bindings, each [group, queue, node, epoch]; 5 `BindingsDeleted`: keys, each
  [group, queue].
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from broker.store_writes import MessageWrite, QueueDeleted, QueueSaved, StoreWrite
from handler.arbiter import Binding
from handler.bindings import BindingsDeleted, BindingsPut, BindingsWrite
from pinmq_pb import cluster_pb2 as pb

FORMAT = 1

Record = StoreWrite | BindingsWrite

# The tuples a `MessageWrite` holds go on the wire as they are (every send and ack makes some:
# no conversion), so format 1 is these fields in this order. A store whose tuples differ (the
# store names their fields, tests/ha/test_replication_wire.py compares) needs a conversion here and
# a new FORMAT.
FIELDS = {
    "added": (
        "msg_id",
        "queue",
        "address",
        "headers",
        "delivery_count",
        "group",
        "group_seq",
        "enqueued_ns",
        "body",
    ),
    "removed": ("msg_id", "queue"),
    "counts": ("count", "msg_id", "queue"),
    "marks": ("origin", "seq"),
    "ids": ("address", "dup_id", "msg_id"),
}


class WireError(Exception):
    """A frame of the replication stream that this backup cannot read; nothing of it applies."""


class FormatError(WireError):
    """A frame of another format than this backup reads."""

    def __init__(self, found: int) -> None:
        super().__init__(
            f"the primary sends replication format {found}, this backup reads format {FORMAT}"
        )


@dataclass(frozen=True, slots=True)
class SnapshotChunk:
    """Rows of one table of one replicated file (`file`: "store" or "bindings"), their values
    in the order of `columns`."""

    file: str
    table: str
    columns: tuple[str, ...]
    rows: Sequence[tuple[Any, ...]]


# ---- records


def encode(record: Record) -> bytes:
    """A write record as the payload of a `ReplicatedOp`."""
    return _pack(_ENCODERS[type(record)](record))


def decode(payload: bytes) -> Record:
    """The write record a `ReplicatedOp`'s payload holds; raises `WireError` (`FormatError`
    for another format) if this backup cannot read it."""
    data = _unpack(payload)
    tag = data[1] if len(data) > 1 else None
    decoder = _DECODERS.get(tag) if type(tag) is int else None
    if decoder is None:
        raise WireError(f"no record type {tag!r} in replication format {FORMAT}")
    try:
        return decoder(data)
    except (TypeError, ValueError) as err:
        raise WireError(f"a malformed record of type {tag}: {err}") from err


# Record types (tags) of format 1; each encoder makes the whole array, each decoder reads it.
_MESSAGES, _QUEUE_SAVED, _QUEUE_DELETED, _BINDINGS_PUT, _BINDINGS_DELETED = range(1, 6)


def _encode_messages(w: MessageWrite) -> list[Any]:
    return [FORMAT, _MESSAGES, w.added, w.removed, w.counts, w.marks, w.ids]


def _decode_messages(data: Sequence[Any]) -> MessageWrite:
    _, _, added, removed, counts, marks, ids = data
    return MessageWrite(added, removed, counts, marks, ids)


def _encode_queue_saved(w: QueueSaved) -> list[Any]:
    return [FORMAT, _QUEUE_SAVED, w.queue, w.address, w.settings]


def _decode_queue_saved(data: Sequence[Any]) -> QueueSaved:
    _, _, queue, address, settings = data
    return QueueSaved(queue, address, settings)


def _encode_queue_deleted(w: QueueDeleted) -> list[Any]:
    return [FORMAT, _QUEUE_DELETED, w.queue]


def _decode_queue_deleted(data: Sequence[Any]) -> QueueDeleted:
    _, _, queue = data
    return QueueDeleted(queue)


def _encode_bindings_put(w: BindingsPut) -> list[Any]:
    return [FORMAT, _BINDINGS_PUT, [[b.group, b.queue, b.node, b.epoch] for b in w.bindings]]


def _decode_bindings_put(data: Sequence[Any]) -> BindingsPut:
    _, _, bindings = data
    return BindingsPut(
        tuple(Binding(group, queue, node, epoch) for group, queue, node, epoch in bindings)
    )


def _encode_bindings_deleted(w: BindingsDeleted) -> list[Any]:
    return [FORMAT, _BINDINGS_DELETED, w.keys]


def _decode_bindings_deleted(data: Sequence[Any]) -> BindingsDeleted:
    _, _, keys = data
    return BindingsDeleted(tuple((group, queue) for group, queue in keys))


_ENCODERS: dict[type, Callable[[Any], list[Any]]] = {
    MessageWrite: _encode_messages,
    QueueSaved: _encode_queue_saved,
    QueueDeleted: _encode_queue_deleted,
    BindingsPut: _encode_bindings_put,
    BindingsDeleted: _encode_bindings_deleted,
}
_DECODERS: dict[int, Callable[[Sequence[Any]], Record]] = {
    _MESSAGES: _decode_messages,
    _QUEUE_SAVED: _decode_queue_saved,
    _QUEUE_DELETED: _decode_queue_deleted,
    _BINDINGS_PUT: _decode_bindings_put,
    _BINDINGS_DELETED: _decode_bindings_deleted,
}


# ---- snapshot chunks


def encode_chunk(chunk: SnapshotChunk) -> pb.SnapshotRows:
    return pb.SnapshotRows(
        file=chunk.file, table=chunk.table, rows=_pack([FORMAT, chunk.columns, chunk.rows])
    )


def decode_chunk(frame: pb.SnapshotRows) -> SnapshotChunk:
    """Raises `WireError` (`FormatError` for another format) if this backup cannot read it."""
    data = _unpack(frame.rows)
    try:
        _, columns, rows = data
        return SnapshotChunk(frame.file, frame.table, tuple(columns), rows)
    except (TypeError, ValueError) as err:
        raise WireError(f"a malformed snapshot chunk of {frame.file}:{frame.table}") from err


# ---- framing


def _pack(data: list[Any]) -> bytes:
    return msgpack.packb(data, use_bin_type=True)


def _unpack(payload: bytes) -> tuple[Any, ...]:
    """The array a payload holds, of this format."""
    try:
        data = msgpack.unpackb(payload, use_list=False, raw=False)
    except (ValueError, msgpack.UnpackException) as err:
        raise WireError(f"not a msgpack array: {err}") from err
    # Before formats were numbered, payloads were the stores' request tuples: none begins
    # with an integer.
    found = data[0] if type(data) is tuple and data and type(data[0]) is int else 0
    if found != FORMAT:
        raise FormatError(found)
    return data
