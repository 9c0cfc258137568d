"""The audit log: one JSON object per event, appended to rolling segment files off the hot path.

Nodes (`audit:` in the node config) and the Python client / CLI (`--audit DIR`) write the
events that the PySpark checker (`pinmq check`, `pipeline/`) reads back. The hot path only
appends a tuple of references to a deque (one per kind of event of a core call); a background
thread formats everything queued since its last turn (every `flush_ms`, or sooner once
`BATCH_ENTRIES` are waiting) and writes it as whole lines with one `write` per batch. A crash
loses at most the events not yet written; lines already written stay intact. A torn last line
(power loss, full disk) is skipped by readers. A failed write (a full disk) drops that batch,
is logged and counted in `dropped`, and never takes the node down; a line it cut short stays
the last line of its segment, as writing goes on in a new one.

The contract (event kinds, fields and their types, file names) is defined once, in
`broker/audit_schema.py`: lines are built by hand here for speed, of its key fragments.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from broker import audit_schema as schema
from broker import logs
from broker.audit_schema import MID_HEADER, Kind


class Changes(Protocol):
    """What a core call changed (`broker.queue.Effects`), as the audit log reads it."""

    added: Sequence[Any]
    removed: Sequence[Any]
    updated: Sequence[Any]
    dead: Sequence[Any]
    deliveries: Sequence[Any]


class RoutingBinding(Protocol):
    """The binding that routed a grouped message (`handler.records.Binding`)."""

    group: str
    epoch: int


log = logs.get("audit")

SEGMENT_BYTES = 64 * 1024 * 1024
FLUSH_MS = 100
BATCH_ENTRIES = 5_000  # wake the writer early once this many entries (or Effects' kinds) wait
COMMON_CACHE = 200_000  # formatted message keys kept for the message's later events

# Queue entries: (kind, ts_ns, items) for node events from one Effects (`effects` has the items
# of each kind), ("routed", ts_ns, (fields of `routed`)), ("moved", ts_ns, (messages, target)),
# (kind, ts_ns, {key: value}) for the rest (`record`). The writer tells kinds apart by identity.
_SENT, _ROUTED, _DELIVERED = Kind.SENT.value, Kind.ROUTED.value, Kind.DELIVERED.value
_ACKED, _RELEASED, _REJECTED = Kind.ACKED.value, Kind.RELEASED.value, Kind.REJECTED.value
_MOVED = Kind.MOVED.value
_KINDS = frozenset(Kind)
# Key fragments (`,"name":`) of the schema's fields, which the lines are built of: a field
# renamed there is renamed in every line written.
_KEYS = {f.name: f.key for f in schema.FIELDS}
_RECORDED = frozenset(_KEYS) - {schema.KIND.name, schema.N.name}  # what `record` may be given
_START = "{" + schema.TS_NS.key[1:]  # a line starts with its `ts_ns`
_NODE, _EPOCH, _KIND, _N = schema.NODE.key, schema.EPOCH.key, schema.KIND.key, schema.N.key
_MSG_ID, _MID, _ADDRESS = schema.MSG_ID.key, schema.MID.key, schema.ADDRESS.key
_QUEUE, _GROUP, _GROUP_SEQ = schema.QUEUE.key, schema.GROUP.key, schema.GROUP_SEQ.key
_PRODUCER, _CONSUMER, _COUNT = schema.PRODUCER.key, schema.CONSUMER.key, schema.DELIVERY_COUNT.key
_TARGET, _DECISION = schema.TARGET.key, schema.DECISION_NS.key
_ROUTED_KIND = f'{_KIND}"{_ROUTED}"'
_PROPOSALS = (f"{schema.NEW_PROPOSAL.key}false", f"{schema.NEW_PROPOSAL.key}true")
_enc = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]
STRINGS_CACHE = 10_000  # JSON forms of names (queues, consumers, groups) kept between batches


class _Json(dict[str, str]):
    """str -> its JSON form, encoded on first use: a hit is one subscript, no Python call."""

    def __missing__(self, value: str) -> str:
        out = self[value] = _enc(value)
        return out


class AuditLog:
    """A buffered writer of one writer's audit events (a node's or a client's).

    `record`/`effects`/`routed` may be called from one thread (the event loop); `start` runs
    the writer thread, `close` writes what is left and stops it.
    """

    def __init__(
        self,
        directory: str | Path,
        writer: str,
        *,
        node: str | None = None,
        segment_bytes: int = SEGMENT_BYTES,
        flush_ms: int = FLUSH_MS,
        holding: Callable[[], bool] | None = None,
    ) -> None:
        if not writer or "/" in writer:
            raise ValueError(f"bad audit writer name {writer!r}")
        self.dir = Path(directory)
        self.writer = writer
        self.node = node or writer
        self.boot = time.time_ns()
        self.segment_bytes = segment_bytes
        self.flush_s = flush_ms / 1000
        self.written = 0  # events written so far
        self.dropped = 0  # events lost to failed writes
        self._queue: deque[tuple[Any, ...]] = deque()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._file: Any = None
        self._segment = 0
        self._size = 0
        self._n = 0
        self._holder: dict[int, str] = {}  # id(message) -> consumer holding it (writer)
        self._json = _Json()
        self._common: dict[int, tuple[Any, str]] = {}  # id(message) -> (message, its keys)
        self._node_json = _enc(self.node)
        self._torn = False  # a failed write cut a line short: go on in a new segment
        self.error: BaseException | None = None  # the last write's failure, until one succeeds
        # An ha pair's active process: whether it still holds its node. A process that lost
        # its quorum records nothing more (its events would interleave with its successor's).
        self.holding = holding

    @property
    def backlog(self) -> int:
        """Entries (each one event or a batch of them) waiting for the writer thread."""
        return len(self._queue)

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> AuditLog:
        """Create the directory and start the writer thread (OSError if it cannot)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._open()
        self._thread = threading.Thread(target=self._run, name=f"audit-{self.writer}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Write everything recorded so far and stop the writer thread."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._flush_or_log()
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> AuditLog:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- recording (hot path: queue references, format nothing) -----------------------------

    def effects(self, fx: Changes) -> None:
        """Node events for one core call's Effects (called from `Engine._apply`).

        One queue entry per kind of event, holding the messages: their fields other than the
        delivery count (taken here) do not change once they are enqueued, so the writer reads
        them later, and works out there which consumer held a removed message.
        """
        if not (fx.added or fx.deliveries or fx.removed or fx.updated or fx.dead):
            return
        if self.holding is not None and not self.holding():
            return
        ts = time.time_ns()
        put = self._queue.append
        if fx.added:
            put((_SENT, ts, tuple(fx.added)))
        if fx.removed:
            removed = fx.removed
            if fx.dead:  # rejected, not acked
                dead = {id(m) for m in fx.dead}
                removed = [m for m in removed if id(m) not in dead]
            put((_ACKED, ts, tuple(removed)))
        if fx.dead:
            put((_REJECTED, ts, [(m, m.delivery_count) for m in fx.dead]))
        if fx.updated:
            put((_RELEASED, ts, [(m, m.delivery_count) for m in fx.updated]))
        if fx.deliveries:
            ds = [(d.message, d.consumer_id, d.message.delivery_count + 1) for d in fx.deliveries]
            put((_DELIVERED, ts, ds))
        if len(self._queue) >= BATCH_ENTRIES:
            self._wake.set()

    def routed(
        self,
        msg_id: int | None,
        address: str,
        headers: Mapping[str, str],
        queue: str,
        node: str,
        binding: RoutingBinding | None = None,
        decision_ns: int | None = None,
    ) -> None:
        """The cluster send path routed a message to `queue@node` (`cluster/sending.py`).

        `binding`: the group's binding that chose the instance (None: ungrouped routing);
        `decision_ns`: this node proposed a route for the group and awaited the decision for
        that long (`new_proposal`), as neither its cache nor its arbiter knew the group. Only
        references are queued: `headers` (for the `mid`) and `binding` are read by the writer.
        """
        if self.holding is not None and not self.holding():
            return
        fields = (msg_id, address, headers, queue, node, binding, decision_ns)
        self._queue.append((_ROUTED, time.time_ns(), fields))
        if len(self._queue) >= BATCH_ENTRIES:
            self._wake.set()

    def moved(self, messages: Sequence[Any], target: str) -> None:
        """A held group's messages left this node for the group's binding `target` (queue@node).

        Called before the messages are forwarded; they keep their `mid`, so the checker can
        tell the order change this causes (older messages after newer ones) from a violation.
        """
        if self.holding is not None and not self.holding():
            return
        self._queue.append((_MOVED, time.time_ns(), (tuple(messages), target)))
        if len(self._queue) >= BATCH_ENTRIES:
            self._wake.set()

    def record(self, kind: Kind, **fields: Any) -> None:
        """Any other event (client events, `unbound`): fields of the schema (ValueError for
        others); None values are left out. `node` overrides the writer's (a client names the
        node it was connected to then)."""
        if kind not in _KINDS or not fields.keys() <= _RECORDED:
            raise ValueError(
                f"not in the audit schema: {kind!r} {sorted(fields.keys() - _RECORDED)}"
            )
        if self.holding is not None and not self.holding():
            return
        self._queue.append((kind, fields.pop("ts_ns", None) or time.time_ns(), fields))
        if len(self._queue) >= BATCH_ENTRIES:
            self._wake.set()

    # ---- writing (the writer thread) --------------------------------------------------------

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.flush_s)
            self._wake.clear()
            if not self._flush_or_log():
                time.sleep(self.flush_s)

    def _flush_or_log(self) -> bool:
        """Flush; a failure (a full disk) must not take the node down: log it, keep the error."""
        try:
            self._flush()
        except Exception as err:
            if self.error is None or str(err) != str(self.error):
                log.error("audit write failed", dir=str(self.dir), error=str(err),
                          dropped=self.dropped)  # fmt: skip
            self.error = err
            return False
        return True

    def _flush(self) -> None:
        q = self._queue
        count = len(q)
        if not count:
            return
        lines = self._lines(q, count)
        data = "".join(lines).encode()
        fits = self._size + len(data) <= self.segment_bytes
        left = len(lines)
        for chunk, n in [(data, left)] if fits else self._chunks(lines):
            try:
                self._write(chunk)
            except Exception:
                self.dropped += left
                raise
            self.written += n
            left -= n
        if self.error is not None:
            log.warning("audit writing resumed", dir=str(self.dir), dropped=self.dropped)
            self.error = None

    def _lines(self, q: deque[tuple[Any, ...]], count: int) -> list[str]:
        """Format the first `count` queue entries: the audit log's cost per event.

        This runs in the writer thread but holds the GIL, so every instruction is taken from
        the event loop: one tight loop per entry's kind, everything in locals. A message's own
        keys are the same in its sent, delivered and acked events: formatted once and kept
        (with the message: an id alone could be reused) until it is settled.
        """
        if len(self._json) > STRINGS_CACHE:
            self._json.clear()
        if len(self._common) > COMMON_CACHE:
            self._common.clear()
        js = self._json
        common = self._common
        cached = common.get
        keys = self._message_keys
        holder = self._holder
        head = f'{_NODE}{self._node_json}{_KIND}"'
        pop = q.popleft
        lines: list[str] = []
        add = lines.append
        n = self._n
        for _ in range(count):
            kind, ts, items = pop()
            if type(items) is dict or kind is _ROUTED:  # record() or routed(): one event
                n += 1
                add(self._other_line(kind, ts, items, n))
                continue
            pre = f'{_START}{ts}{head}{kind}"'
            if kind is _SENT:
                for m in items:
                    mk = keys(m)
                    common[id(m)] = (m, mk)
                    n += 1
                    add(f"{pre}{mk}{_N}{n}}}\n")
            elif kind is _DELIVERED:
                for m, consumer, delivery_count in items:
                    key = id(m)
                    holder[key] = consumer
                    c = cached(key)
                    if c is not None and c[0] is m:
                        mk = c[1]
                    else:
                        mk = keys(m)
                        common[key] = (m, mk)
                    n += 1
                    add(f"{pre}{mk}{_CONSUMER}{js[consumer]}{_COUNT}{delivery_count}{_N}{n}}}\n")
            elif kind is _MOVED:
                msgs, target = items
                for m in msgs:
                    n += 1
                    add(f"{pre}{keys(m)}{_TARGET}{js[target]}{_COUNT}{m.delivery_count}{_N}{n}}}\n")
            elif kind is _ACKED:
                for m in items:
                    key = id(m)
                    consumer = holder.pop(key, None)
                    if consumer is None:
                        continue  # removed while no consumer held it: taken away, not acked
                    c = common.pop(key, None)
                    mk = c[1] if c is not None and c[0] is m else keys(m)
                    n += 1
                    add(f"{pre}{mk}{_CONSUMER}{js[consumer]}{_N}{n}}}\n")
            else:  # released or rejected
                for m, delivery_count in items:
                    key = id(m)
                    consumer = holder.pop(key, None)
                    c = common.pop(key, None) if kind is _REJECTED else cached(key)
                    mk = c[1] if c is not None and c[0] is m else keys(m)
                    who = "" if consumer is None else f"{_CONSUMER}{js[consumer]}"
                    n += 1
                    add(f"{pre}{mk}{who}{_COUNT}{delivery_count}{_N}{n}}}\n")
        self._n = n
        return lines

    def _chunks(self, lines: list[str]) -> list[tuple[bytes, int]]:
        """`lines` cut where a segment fills up: (bytes, lines) per segment, `_write` rolls."""
        chunks: list[tuple[bytes, int]] = []
        chunk: list[bytes] = []
        size = self._size
        for line in lines:
            raw = line.encode()
            if size + len(raw) > self.segment_bytes and size > 0:
                if chunk:
                    chunks.append((b"".join(chunk), len(chunk)))
                    chunk = []
                size = 0
            chunk.append(raw)
            size += len(raw)
        if chunk:
            chunks.append((b"".join(chunk), len(chunk)))
        return chunks

    def _write(self, data: bytes) -> None:
        if self._torn or (self._size > 0 and self._size + len(data) > self.segment_bytes):
            self._roll()
        view = memoryview(data)
        try:
            while view:  # whole lines, one system call unless the disk fills up
                written = os.write(self._file.fileno(), view)
                view = view[written:]
                self._size += written
        except OSError:
            self._torn = len(view) < len(data)  # a cut line must stay its segment's last
            raise

    def _open(self) -> None:
        name = schema.segment_name(self.writer, self.boot, self._segment)
        self._file = open(self.dir / name, "ab", buffering=0)  # noqa: SIM115 -- kept open
        self._size = self._file.seek(0, os.SEEK_END)

    def _roll(self) -> None:
        self._file.close()
        self._segment += 1
        self._open()
        self._torn = False

    def _other_line(self, kind: str, ts: int, fields: Any, n: int) -> str:
        """A `record` event (a dict) or a `routed` one (fields as `routed` queued them)."""
        if type(fields) is not dict:
            return self._routed_line(ts, fields, n)
        node = fields.pop("node", None)  # a failover client's node of the moment
        head = f"{_START}{ts}{_NODE}{self._node_json if node is None else _enc(node)}"
        epoch = fields.pop("epoch", None)
        if epoch is not None:
            head += f"{_EPOCH}{int(epoch)}"
        body = "".join(f"{_KEYS[k]}{json.dumps(v)}" for k, v in fields.items() if v is not None)
        return f"{head}{_KIND}{_enc(kind)}{body}{_N}{n}}}\n"

    def _routed_line(self, ts: int, fields: tuple[Any, ...], n: int) -> str:
        msg_id, address, headers, queue, node, binding, decision = fields
        out = [f"{_START}{ts}{_NODE}{self._node_json}"]
        if binding is not None:
            out.append(f"{_EPOCH}{binding.epoch}")
        out.append(_ROUTED_KIND)
        if msg_id is not None:
            out.append(f"{_MSG_ID}{msg_id}")
        mid = headers.get(MID_HEADER)
        if mid is not None:
            out.append(f"{_MID}{_enc(mid)}")
        js = self._json
        out.append(f"{_ADDRESS}{js[address]}{_QUEUE}{js[queue]}")
        if binding is not None:
            out.append(f"{_GROUP}{js[binding.group]}")
        out.append(f"{_TARGET}{js[f'{queue}@{node}']}")
        if binding is not None:
            out.append(_PROPOSALS[decision is not None])
        if decision is not None:
            out.append(f"{_DECISION}{decision}")
        out.append(f"{_N}{n}}}\n")
        return "".join(out)

    def _message_keys(self, m: Any) -> str:
        """A message's own keys (msg_id, address, queue, group, group_seq, mid, producer)."""
        js = self._json
        out = f"{_MSG_ID}{m.msg_id}{_ADDRESS}{js[m.address]}{_QUEUE}{js[m.queue]}"
        if m.group is not None:
            out += f"{_GROUP}{js[m.group]}"
        if m.group_seq:
            out += f"{_GROUP_SEQ}{m.group_seq}"
        mid = m.headers.get(MID_HEADER)
        if mid is not None:
            out += f"{_MID}{_enc(mid)}"
            producer = mid.rpartition("/")[0]
            if producer:
                out += f"{_PRODUCER}{js[producer]}"
        return out


def segments(directory: str | Path) -> list[Path]:
    """Every segment file under `directory` (recursively), in name order."""
    return sorted(p for p in Path(directory).rglob("*.jsonl") if p.is_file())


def read_events(path: str | Path) -> Iterator[dict[str, Any]]:
    """The events of one segment file; a torn last line (no newline, not JSON) is skipped.

    Raises ValueError naming the file and line for a malformed line anywhere else.
    """
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    last = len(lines) - 1  # the piece after the final newline: "" unless the tail is torn
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            event = json.loads(raw)
        except ValueError:
            if i == last:
                return  # torn tail: the writer died in the middle of a line
            raise ValueError(f"{path}:{i + 1}: malformed audit line") from None
        if not isinstance(event, dict):
            raise ValueError(f"{path}:{i + 1}: not a JSON object")
        yield event


def node_audit(config: Any, holding: Callable[[], bool] | None = None) -> AuditLog | None:
    """The node's audit writer per its `audit` config section, or None when disabled;
    `holding`: see AuditLog."""
    section = getattr(config, "audit", None)
    if section is None or not section.enabled:
        return None
    directory = section.dir if section.dir is not None else Path(config.node.data_dir) / "audit"
    return AuditLog(
        directory,
        config.node.id,
        segment_bytes=section.segment_bytes,
        flush_ms=section.flush_ms,
        holding=holding,
    )
