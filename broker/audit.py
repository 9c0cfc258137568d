"""The audit log: one JSON object per event, appended to rolling segment files off the hot path.

Nodes (`audit:` in the node config) and the Python client / CLI (`--audit DIR`) write the
events that the PySpark checker (`pinmq check`, `pipeline/`) reads back. The hot path only
appends a tuple to a deque; a background thread formats every event queued since its last
turn (every `flush_ms`, or sooner once `BATCH_EVENTS` are waiting) and writes them as whole
lines with one `write` per batch. A crash loses at most the events not yet written; lines
already written stay intact. A torn last line (power loss, full disk) is skipped by readers.

Files: `<dir>/<writer>-<boot ns>-<k>.jsonl`, a new `k` once a segment reaches `segment_bytes`;
`writer` is the node id (or the client's audit name) and `boot` the writer's start time, so a
node restarted after a crash writes new files and readers can tell its runs apart.

Schema (one object per line; a key whose value would be null is left out):

| key | type | meaning |
| --- | --- | --- |
| `ts_ns` | int | wall clock (ns) when the event happened |
| `node` | str | node id; for client events the `host:port` the client was connected to |
| `epoch` | int | arbiter epoch (`routed` events) |
| `kind` | str | node: `sent` `routed` `delivered` `acked` `released` `rejected`; |
| | | client: `client_sent` `client_received` `client_acked` |
| `msg_id` | int | the message id on that node (a forwarded message gets a new one) |
| `address`, `queue` | str | where the message was sent / which queue held it |
| `group`, `group_seq` | str, int | resolved group key and JMSXGroupSeq (0: none) |
| `producer` | str | producer id of an auditing client (from `mid`) |
| `consumer` | str | consumer id (as assigned by the node) |
| `delivery_count` | int | `delivered` / `client_received`: this delivery's count (1 = first) |
| `mid` | str | end-to-end id `<producer>/<n>` from the `pinmq-mid` header (extension) |
| `n` | int | the writer's event sequence number, orders events with equal `ts_ns` (extension) |
| `target` | str | `routed`: chosen `queue@node` (extension) |
| `new_proposal` | bool | `routed`: the binding came from a new proposal (extension) |
| `decision_ns` | int | `routed` with a new proposal: time to get the decision (extension) |
| `consumer_name` | str | client events: the consumer's name (extension) |

Node events come from the core's `Effects`: `sent` (added), `delivered` (deliveries),
`acked` (removed while a consumer held it, not dead), `released` (updated: released, or
returned when its consumer went away), `rejected` (dead: rejected or out of delivery
attempts). `routed` comes from the cluster send path through `AuditLog.routed`.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.queue import Effects

MID_HEADER = "pinmq-mid"
SEGMENT_BYTES = 64 * 1024 * 1024
FLUSH_MS = 100
BATCH_EVENTS = 20_000  # wake the writer early once this many events wait
COMMON_CACHE = 200_000  # formatted message keys kept for the message's later events
NODE_KINDS = ("sent", "routed", "delivered", "acked", "released", "rejected")
CLIENT_KINDS = ("client_sent", "client_received", "client_acked")
KINDS = NODE_KINDS + CLIENT_KINDS
SEGMENT_RE = re.compile(r"^(?P<writer>.+)-(?P<boot>\d+)-(?P<k>\d+)\.jsonl$")

# Queued events: (kind, ts_ns, message, consumer, delivery_count) for node events from Effects,
# (kind, ts_ns, None, None, {key: value}) for everything else.
_SENT, _DELIVERED, _ACKED, _RELEASED, _REJECTED = (
    "sent",
    "delivered",
    "acked",
    "released",
    "rejected",
)
_enc = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]


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
        self._queue: deque[tuple[Any, ...]] = deque()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._file: Any = None
        self._segment = 0
        self._size = 0
        self._n = 0
        self._holder: dict[int, str] = {}  # id(message) -> consumer holding it
        self._cache: dict[str, str] = {}
        self._common: dict[int, tuple[Any, str]] = {}  # id(message) -> (message, its keys)
        self._node_json = _enc(self.node)
        self.error: BaseException | None = None

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
        self._flush()
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> AuditLog:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- recording (hot path: append a tuple, nothing else) ---------------------------------

    def effects(self, fx: Effects) -> None:
        """Node events for one core call's Effects (called from `Node.apply`).

        Only references are queued: a message's fields other than its delivery count (taken
        here) do not change once it is enqueued, so the writer thread reads them later.
        """
        if not (fx.added or fx.deliveries or fx.removed or fx.updated or fx.dead):
            return
        ts = time.time_ns()
        put = self._queue.append
        holder = self._holder
        for m in fx.added:
            put((_SENT, ts, m, None, None))
        if fx.removed:
            dead = {id(m) for m in fx.dead} if fx.dead else ()
            for m in fx.removed:  # removed without a holder: taken away, not acked
                if id(m) not in dead and (c := holder.pop(id(m), None)) is not None:
                    put((_ACKED, ts, m, c, None))
        for m in fx.dead:
            put((_REJECTED, ts, m, holder.pop(id(m), None), m.delivery_count))
        for m in fx.updated:
            put((_RELEASED, ts, m, holder.pop(id(m), None), m.delivery_count))
        for d in fx.deliveries:
            m = d.message
            holder[id(m)] = d.consumer_id
            put((_DELIVERED, ts, m, d.consumer_id, m.delivery_count + 1))
        if len(self._queue) >= BATCH_EVENTS:
            self._wake.set()

    def routed(
        self,
        *,
        address: str,
        group: str | None,
        queue: str,
        node: str,
        epoch: int | None,
        new_proposal: bool,
        msg_id: int | None = None,
        mid: str | None = None,
        decision_ns: int | None = None,
    ) -> None:
        """A grouped send was routed to `queue@node` (for the cluster send path to call).

        `new_proposal`: the binding was decided for this message (a new group), not found in
        the cache or the arbiter's table; `decision_ns` is how long that decision took.
        """
        self.record(
            "routed",
            epoch=epoch,
            msg_id=msg_id,
            mid=mid,
            address=address,
            queue=queue,
            group=group,
            target=f"{queue}@{node}",
            new_proposal=new_proposal,
            decision_ns=decision_ns,
        )

    def record(self, kind: str, **fields: Any) -> None:
        """Any event (client events use this): keys as in the schema; None values are left out."""
        self._queue.append((kind, fields.pop("ts_ns", None) or time.time_ns(), None, None, fields))
        if len(self._queue) >= BATCH_EVENTS:
            self._wake.set()

    # ---- writing (the writer thread) --------------------------------------------------------

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.flush_s)
            self._wake.clear()
            try:
                self._flush()
            except Exception as err:  # a full disk must not take the node down: keep the error
                self.error = err
                time.sleep(self.flush_s)

    def _flush(self) -> None:
        q = self._queue
        count = len(q)
        if not count:
            return
        pop = q.popleft
        lines = [self._line(pop()) for _ in range(count)]
        data = "".join(lines).encode()
        if self._size + len(data) > self.segment_bytes:
            self._write_split(lines)
        else:
            self._write(data)
        self.written += count

    def _write_split(self, lines: list[str]) -> None:
        chunk: list[bytes] = []
        size = self._size
        for line in lines:
            raw = line.encode()
            if size + len(raw) > self.segment_bytes and size > 0:
                if chunk:
                    self._write(b"".join(chunk))
                    chunk = []
                self._roll()
                size = 0
            chunk.append(raw)
            size += len(raw)
        if chunk:
            self._write(b"".join(chunk))

    def _write(self, data: bytes) -> None:
        if self._size > 0 and self._size + len(data) > self.segment_bytes:
            self._roll()
        os.write(self._file.fileno(), data)  # whole lines, one system call
        self._size += len(data)

    def _open(self) -> None:
        name = f"{self.writer}-{self.boot}-{self._segment}.jsonl"
        self._file = open(self.dir / name, "ab", buffering=0)  # noqa: SIM115 -- kept open
        self._size = self._file.seek(0, os.SEEK_END)

    def _roll(self) -> None:
        self._file.close()
        self._segment += 1
        self._open()

    def _str(self, value: str) -> str:
        cache = self._cache
        out = cache.get(value)
        if out is None:
            if len(cache) > 10_000:
                cache.clear()
            out = cache[value] = _enc(value)
        return out

    def _line(self, e: tuple[Any, ...]) -> str:
        kind, ts, m, consumer, count = e
        self._n += 1
        if m is None:  # record(): every key is in the dict
            fields = count
            head = f'{{"ts_ns":{ts},"node":{self._node_json}'
            epoch = fields.pop("epoch", None)
            if epoch is not None:
                head += f',"epoch":{int(epoch)}'
            body = "".join(
                f",{_enc(k)}:{json.dumps(v)}" for k, v in fields.items() if v is not None
            )
            return f'{head},"kind":{_enc(kind)}{body},"n":{self._n}}}\n'
        # The message's own keys are the same in its sent, delivered and acked events: format
        # them once (cached until the message is settled; the cache is bounded).
        cached = self._common.get(id(m))
        if cached is not None and cached[0] is m:
            common = cached[1]
            if kind is _ACKED or kind is _REJECTED:
                del self._common[id(m)]
        else:
            common = self._message_keys(m)
            if kind is not _ACKED and kind is not _REJECTED:
                if len(self._common) >= COMMON_CACHE:
                    self._common.clear()
                self._common[id(m)] = (m, common)
        tail = f',"consumer":{self._str(consumer)}' if consumer is not None else ""
        if count is not None:
            tail += f',"delivery_count":{count}'
        return (
            f'{{"ts_ns":{ts},"node":{self._node_json},"kind":"{kind}"{common}{tail},'
            f'"n":{self._n}}}\n'
        )

    def _message_keys(self, m: Any) -> str:
        mid = m.headers.get(MID_HEADER)
        parts = [f',"msg_id":{m.msg_id}']
        if mid is not None:
            parts.append(f',"mid":{_enc(mid)}')
        parts.append(f',"address":{self._str(m.address)},"queue":{self._str(m.queue)}')
        if m.group is not None:
            parts.append(f',"group":{_enc(m.group)}')
        if m.group_seq:
            parts.append(f',"group_seq":{int(m.group_seq)}')
        if mid is not None:
            producer = mid.rpartition("/")[0]
            if producer:
                parts.append(f',"producer":{self._str(producer)}')
        return "".join(parts)


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


def node_audit(config: Any) -> AuditLog | None:
    """The node's audit writer per its `audit` config section, or None when disabled."""
    section = getattr(config, "audit", None)
    if section is None or not section.enabled:
        return None
    directory = section.dir if section.dir is not None else Path(config.node.data_dir) / "audit"
    return AuditLog(
        directory,
        config.node.id,
        segment_bytes=section.segment_bytes,
        flush_ms=section.flush_ms,
    )
