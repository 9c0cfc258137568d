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

Files: `<dir>/<writer>-<boot ns>-<k>.jsonl`, a new `k` once a segment reaches `segment_bytes`;
`writer` is the node id (or the client's audit name) and `boot` the writer's start time, so a
node restarted after a crash writes new files and readers can tell its runs apart.

Schema (one object per line; a key whose value would be null is left out):

| key | type | meaning |
| --- | --- | --- |
| `ts_ns` | int | wall clock (ns) when the event happened |
| `node` | str | node id; for client events the `host:port` the client was connected to |
| `epoch` | int | `routed` by a group's binding, `unbound`: the arbiter epoch of that binding |
| `kind` | str | node: `sent` `routed` `delivered` `acked` `released` `rejected` `unbound` |
| | | `moved`; |
| | | client: `client_sent` `client_received` `client_acked` |
| `msg_id` | int | the message id on that node (a forwarded message gets a new one) |
| `address`, `queue` | str | where the message was sent / which queue held it |
| `group`, `group_seq` | str, int | resolved group key and JMSXGroupSeq (0: none); |
| | | `routed`: the group key whose binding chose the target (absent: ungrouped) |
| `producer` | str | producer id of an auditing client (from `mid`) |
| `consumer` | str | consumer id (as assigned by the node) |
| `delivery_count` | int | `delivered` / `client_received`: this delivery's count (1 = first); |
| | | `released` / `rejected` / `moved`: the deliveries the message had had |
| `mid` | str | end-to-end id `<producer>/<n>` from the `pinmq-mid` header (extension) |
| `n` | int | the writer's event sequence number, orders events with equal `ts_ns` (extension) |
| `target` | str | `routed`: chosen `queue@node`; `unbound`: the binding's; `moved`: where |
| | | the message went (extension) |
| `new_proposal` | bool | `routed` with a group: this node proposed a route for the group and |
| | | awaited the decision, as its cache or arbiter did not know it (extension) |
| `decision_ns` | int | `routed` with a new proposal: time to get the decision (extension) |
| `consumer_name` | str | client events: the consumer's name (extension) |
| `reason` | str | `unbound`: `reaped` `unbound` `instance-deleted` `instance-absent` (extension) |

Node events come from the core's `Effects`: `sent` (added), `delivered` (deliveries),
`acked` (removed while a consumer held it, not dead), `released` (updated: released, or
returned when its consumer went away), `rejected` (dead: rejected or out of delivery
attempts). A message forwarded from another node is `sent` on the node that enqueues it.
`routed` comes from the cluster send path (`AuditLog.routed`): one per message and target
queue on a clustered address, grouped (`group`, `epoch`, `new_proposal`) or not; the
message's `sent` follows, in the target queue or in the store-and-forward queue (`$sf.`)
that carries it to `target`'s node, with the same `msg_id`. `unbound` (an extension) is
written by the LOCAL node when a binding is removed (`group`, `queue`, `target`, `epoch`,
`reason`): the group may then be bound again, elsewhere, within the same epoch. `moved` (an
extension) is written by a node that held a group it found bound elsewhere (after a restart,
or a removal of its binding) and sent the group's waiting messages on to `target`
(`cluster/claims.py`); each arrives there as a new `sent` with the same `mid`.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from broker import logs


class Changes(Protocol):
    """What a core call changed (`broker.queue.Effects`), as the audit log reads it."""

    added: Sequence[Any]
    removed: Sequence[Any]
    updated: Sequence[Any]
    dead: Sequence[Any]
    deliveries: Sequence[Any]


class RoutingBinding(Protocol):
    """The binding that routed a grouped message (`handler.arbiter.Binding`)."""

    group: str
    epoch: int


log = logs.get("audit")

MID_HEADER = "pinmq-mid"
SEGMENT_BYTES = 64 * 1024 * 1024
FLUSH_MS = 100
BATCH_ENTRIES = 5_000  # wake the writer early once this many entries (or Effects' kinds) wait
COMMON_CACHE = 200_000  # formatted message keys kept for the message's later events
NODE_KINDS = ("sent", "routed", "delivered", "acked", "released", "rejected", "unbound", "moved")
CLIENT_KINDS = ("client_sent", "client_received", "client_acked")
KINDS = NODE_KINDS + CLIENT_KINDS
SEGMENT_RE = re.compile(r"^(?P<writer>.+)-(?P<boot>\d+)-(?P<k>\d+)\.jsonl$")

# Queue entries: (kind, ts_ns, items) for node events from one Effects (`effects` has the items
# of each kind), ("routed", ts_ns, (fields of `routed`)), ("moved", ts_ns, (messages, target)),
# (kind, ts_ns, {key: value}) for the rest (`record`).
_SENT, _ROUTED, _DELIVERED, _ACKED, _RELEASED, _REJECTED, _, _MOVED = NODE_KINDS
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
        """Node events for one core call's Effects (called from `Engine.apply`).

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

    def record(self, kind: str, **fields: Any) -> None:
        """Any other event (client events): keys as in the schema; None values are left out.
        `node` overrides the writer's (a client names the node it was connected to then)."""
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
        head = f',"node":{self._node_json},"kind":"'
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
            pre = f'{{"ts_ns":{ts}{head}{kind}"'
            if kind is _SENT:
                for m in items:
                    mk = keys(m)
                    common[id(m)] = (m, mk)
                    n += 1
                    add(f'{pre}{mk},"n":{n}}}\n')
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
                    add(
                        f'{pre}{mk},"consumer":{js[consumer]},'
                        f'"delivery_count":{delivery_count},"n":{n}}}\n'
                    )
            elif kind is _MOVED:
                msgs, target = items
                for m in msgs:
                    n += 1
                    add(
                        f'{pre}{keys(m)},"target":{js[target]},'
                        f'"delivery_count":{m.delivery_count},"n":{n}}}\n'
                    )
            elif kind is _ACKED:
                for m in items:
                    key = id(m)
                    consumer = holder.pop(key, None)
                    if consumer is None:
                        continue  # removed while no consumer held it: taken away, not acked
                    c = common.pop(key, None)
                    mk = c[1] if c is not None and c[0] is m else keys(m)
                    n += 1
                    add(f'{pre}{mk},"consumer":{js[consumer]},"n":{n}}}\n')
            else:  # released or rejected
                for m, delivery_count in items:
                    key = id(m)
                    consumer = holder.pop(key, None)
                    c = common.pop(key, None) if kind is _REJECTED else cached(key)
                    mk = c[1] if c is not None and c[0] is m else keys(m)
                    who = "" if consumer is None else f',"consumer":{js[consumer]}'
                    n += 1
                    add(f'{pre}{mk}{who},"delivery_count":{delivery_count},"n":{n}}}\n')
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
        name = f"{self.writer}-{self.boot}-{self._segment}.jsonl"
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
        head = f'{{"ts_ns":{ts},"node":{self._node_json if node is None else _enc(node)}'
        epoch = fields.pop("epoch", None)
        if epoch is not None:
            head += f',"epoch":{int(epoch)}'
        body = "".join(f",{_enc(k)}:{json.dumps(v)}" for k, v in fields.items() if v is not None)
        return f'{head},"kind":{_enc(kind)}{body},"n":{n}}}\n'

    def _routed_line(self, ts: int, fields: tuple[Any, ...], n: int) -> str:
        msg_id, address, headers, queue, node, binding, decision = fields
        out = [f'{{"ts_ns":{ts},"node":{self._node_json}']
        if binding is not None:
            out.append(f',"epoch":{binding.epoch}')
        out.append(',"kind":"routed"')
        if msg_id is not None:
            out.append(f',"msg_id":{msg_id}')
        mid = headers.get(MID_HEADER)
        if mid is not None:
            out.append(f',"mid":{_enc(mid)}')
        js = self._json
        out.append(f',"address":{js[address]},"queue":{js[queue]}')
        if binding is not None:
            out.append(f',"group":{js[binding.group]}')
        out.append(f',"target":{js[f"{queue}@{node}"]}')
        if binding is not None:
            out.append(',"new_proposal":false' if decision is None else ',"new_proposal":true')
        if decision is not None:
            out.append(f',"decision_ns":{decision}')
        out.append(f',"n":{n}}}\n')
        return "".join(out)

    def _message_keys(self, m: Any) -> str:
        """A message's own keys (msg_id, address, queue, group, group_seq, mid, producer)."""
        js = self._json
        out = f',"msg_id":{m.msg_id},"address":{js[m.address]},"queue":{js[m.queue]}'
        if m.group is not None:
            out += f',"group":{js[m.group]}'
        if m.group_seq:
            out += f',"group_seq":{m.group_seq}'
        mid = m.headers.get(MID_HEADER)
        if mid is not None:
            out += f',"mid":{_enc(mid)}'
            producer = mid.rpartition("/")[0]
            if producer:
                out += f',"producer":{js[producer]}'
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
