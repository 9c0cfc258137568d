"""The reading side of the message store: start-up loads and paged messages read back.

Each read opens a read-only connection of its own (any thread): in WAL mode it sees every
committed write and never blocks the writer thread (`broker/store.py`), which inherits these.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from broker import sqlite_file
from broker.message import Message
from broker.store_sql import (
    SELECT_BY_IDS,
    SELECT_IDS,
    SELECT_INDEX,
    SELECT_MESSAGES,
    read_messages,
)

IDS_PER_SELECT = 500  # msg ids bound in one SELECT (SQLite allows 32766 variables)
# A stored message by its index, without its body: msg_id, queue, group (None: ungrouped),
# enqueued_ns.
IndexRow = tuple[int, str, str | None, int]


class IndexRun(NamedTuple):
    """The stored messages of one group of one queue by their index (`restore_index`): a
    start places each group's run in one step, not a million messages one by one."""

    queue: str
    group: str | None  # None: the queue's ungrouped messages
    msg_ids: array  # ascending ("q": 8 bytes each)
    enqueued_ns: int  # of the newest


def runs_of(rows: Iterable[IndexRow]) -> list[IndexRun]:
    """Rows (each queue's in msg id order) as runs, in the order of their first message."""
    ids: dict[tuple[str, str | None], array] = {}
    newest: dict[tuple[str, str | None], int] = {}
    for msg_id, queue, group, enqueued_ns in rows:
        key = (queue, group)
        run = ids.get(key)
        if run is None:
            run = ids[key] = array("q")
        run.append(msg_id)
        newest[key] = enqueued_ns
    return [IndexRun(q, g, run, newest[q, g]) for (q, g), run in ids.items()]


class StoreError(Exception):
    """A store operation failed; the message names the file and what is wrong."""


class StoreClosed(StoreError):
    """An operation asked of a store that is closed (or closing): nothing was written."""


class StoreReads:
    """What a store file holds, read back (by `Store`, whose file is at `path`)."""

    path: Path

    def load_queues(self) -> list[tuple[str, str, dict]]:
        """(address, queue, settings) of every saved queue, in creation order."""
        with self._reader() as conn:
            rows = conn.execute("SELECT address, name, settings FROM queues ORDER BY id")
            return [(address, name, json.loads(settings)) for address, name, settings in rows]

    def load_messages(self) -> list[Message]:
        """Every stored message ordered by (msg_id, queue), with its latest delivery count."""
        return list(self.messages())

    def messages(self) -> Iterator[Message]:
        """`load_messages` one at a time, so a big store is never all in memory at once.

        Multicast copies (same msg_id) share one body and headers object, as `copy_for` does.
        """
        with self._reader() as conn:
            yield from read_messages(conn.execute(SELECT_MESSAGES))

    def index(self) -> list[IndexRun] | None:
        """Every stored message by its index, a run per group: the key index and a row's
        small columns, no body or headers decoded."""
        with self._reader() as conn:
            return runs_of(conn.execute(SELECT_INDEX))

    def message_count(self) -> int:
        with self._reader() as conn:
            return int(conn.execute("SELECT count(*) FROM messages").fetchone()[0])

    def read_ids(self, queue: str, wanted: Sequence[Sequence[int]]) -> list[list[Message]]:
        """Per list of msg ids: those stored messages of `queue`, oldest first (paged
        messages read back as room frees; any thread, one connection for the lot)."""
        pages: list[list[Message]] = []
        with self._reader() as conn:
            for ids in wanted:
                page: list[Message] = []
                for i in range(0, len(ids), IDS_PER_SELECT):
                    chunk = ids[i : i + IDS_PER_SELECT]
                    sql = f"{SELECT_BY_IDS}({','.join('?' * len(chunk))}) ORDER BY msg_id"
                    page += read_messages(conn.execute(sql, (queue, *chunk)))
                pages.append(page)
        return pages

    def load_marks(self) -> dict[str, int]:
        """Per forwarding origin, the highest sequence stored here (see `write(marks=...)`)."""
        with self._reader() as conn:
            return dict(conn.execute("SELECT origin, seq FROM marks"))

    def load_ids(self) -> list[tuple[str, str, int]]:
        """(address, duplicate id, msg id) of every stored duplicate-detection id, oldest first."""
        with self._reader() as conn:
            return list(conn.execute(SELECT_IDS))

    def store_id(self) -> int:
        """A random number fixed when the store file was created: this store's identity."""
        with self._reader() as conn:
            return int(conn.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()[0])

    @contextlib.contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        try:
            conn = sqlite_file.read_only(self.path)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open for reading: {exc}") from exc
        try:
            yield conn
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: read failed: {exc}") from exc
        finally:
            conn.close()
