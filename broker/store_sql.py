"""The message store's on-disk format: schema, SQL statements, its write records applied as
SQL, and rows read back as messages.

Kept apart from the writer thread (`broker/store.py`) so that what is on disk reads in one place.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator

from broker.message import Message
from broker.store_writes import (
    Folded,
    IdKey,
    MessageKey,
    QueueDeleted,
    QueueSaved,
    StoredMessage,
    StoreWrite,
    fold,
)

APPLICATION_ID = 0x706D7131  # "pmq1" in the SQLite header: marks the file as a pinmq store.
# 2: duplicate_ids. An older file opens as it is: the schema's statements only create what is
# missing, then user_version is raised (a newer file is refused, sqlite_file.verify).
SCHEMA_VERSION = 2

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS queues (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        address TEXT NOT NULL,
        settings TEXT NOT NULL)""",
    # Body last: reading or skipping the small columns never walks a big body's overflow pages.
    """CREATE TABLE IF NOT EXISTS messages (
        id INTEGER PRIMARY KEY,
        msg_id INTEGER NOT NULL,
        queue TEXT NOT NULL,
        address TEXT NOT NULL,
        headers TEXT NOT NULL,
        delivery_count INTEGER NOT NULL,
        grp TEXT,
        group_seq INTEGER NOT NULL,
        enqueued_ns INTEGER NOT NULL,
        body BLOB NOT NULL)""",
    "CREATE UNIQUE INDEX IF NOT EXISTS messages_key ON messages (msg_id, queue)",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO meta (key, value) VALUES ('max_msg_id', 0)",
    # Store-and-forward: per origin, the highest forwarded sequence held here (exactly once).
    "CREATE TABLE IF NOT EXISTS marks (origin TEXT PRIMARY KEY, seq INTEGER NOT NULL)",
    # Names this store to the peers it forwards to: a wiped data dir restarts its msg ids, and
    # receivers must not drop those as duplicates of the old store's.
    "INSERT OR IGNORE INTO meta (key, value) VALUES ('store_id', abs(random() >> 1))",
    # Duplicate detection (broker/duplicates.py): per address, the ids of its latest persistent
    # messages, written in the transaction that adds them; rowid order is the cache's order.
    """CREATE TABLE IF NOT EXISTS duplicate_ids (
        seq INTEGER PRIMARY KEY,
        address TEXT NOT NULL,
        dup_id TEXT NOT NULL,
        msg_id INTEGER NOT NULL)""",
    "CREATE UNIQUE INDEX IF NOT EXISTS duplicate_ids_key ON duplicate_ids (address, dup_id)",
)
INSERT = (
    "INSERT OR REPLACE INTO messages (msg_id, queue, address, headers, delivery_count, grp,"
    " group_seq, enqueued_ns, body) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
DELETE = "DELETE FROM messages WHERE msg_id = ? AND queue = ?"
UPDATE = "UPDATE messages SET delivery_count = ? WHERE msg_id = ? AND queue = ?"
SAVE_QUEUE = (
    "INSERT INTO queues (name, address, settings) VALUES (?, ?, ?) ON CONFLICT (name)"
    " DO UPDATE SET address = excluded.address, settings = excluded.settings"
)
UPSERT_MARK = (
    "INSERT INTO marks (origin, seq) VALUES (?, ?) ON CONFLICT (origin)"
    " DO UPDATE SET seq = max(seq, excluded.seq)"
)
# Replaced, an id moves to the end (a new rowid): it is the newest again.
PUT_ID = "INSERT OR REPLACE INTO duplicate_ids (address, dup_id, msg_id) VALUES (?, ?, ?)"
DELETE_ID = "DELETE FROM duplicate_ids WHERE address = ? AND dup_id = ?"
SELECT_IDS = "SELECT address, dup_id, msg_id FROM duplicate_ids ORDER BY seq"
SELECT_MESSAGES = (
    "SELECT msg_id, queue, address, headers, delivery_count, grp, group_seq, enqueued_ns, body"
    " FROM messages ORDER BY msg_id, queue"
)
SELECT_INDEX = "SELECT msg_id, queue, grp, enqueued_ns FROM messages ORDER BY msg_id, queue"
SELECT_BY_IDS = (  # + "(?, ?, ...)": the ids, then ORDER BY
    "SELECT msg_id, queue, address, headers, delivery_count, grp, group_seq, enqueued_ns, body"
    " FROM messages WHERE queue = ? AND msg_id IN "
)


def apply(conn: sqlite3.Connection, writes: Iterable[StoreWrite], max_id: int) -> tuple[int, int]:
    """Execute writes in call order inside the caller's transaction, and raise the stored
    highest msg id past `max_id`; returns that id and the count of rows deleted."""
    deleted = 0
    highest = max_id
    for item in fold(writes):
        if type(item) is Folded:
            if item.marks:
                conn.executemany(UPSERT_MARK, item.marks)
            deleted += _apply_net(conn, item.messages)
            deleted += _apply_ids(conn, item.ids)
            highest = max(highest, item.highest)
        elif type(item) is QueueSaved:
            conn.execute(SAVE_QUEUE, (item.queue, item.address, item.settings))
        elif type(item) is QueueDeleted:
            name = (item.queue,)
            deleted += max(conn.execute("DELETE FROM messages WHERE queue = ?", name).rowcount, 0)
            conn.execute("DELETE FROM queues WHERE name = ?", name)
    if highest > max_id:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'max_msg_id'", (highest,))
    return highest, deleted


def _apply_net(conn: sqlite3.Connection, net: dict[MessageKey, StoredMessage | int | None]) -> int:
    """Execute folded message operations (keys are distinct, so order is free); rows deleted."""
    if not net:
        return 0
    puts: list[StoredMessage] = []
    dels: list[MessageKey] = []
    upds: list[tuple[int, int, str]] = []
    for key, value in net.items():
        if value is None:
            dels.append(key)
        elif type(value) is tuple:
            puts.append(value)
        else:
            upds.append((value, key[0], key[1]))
    deleted = 0
    if dels:
        deleted = max(conn.executemany(DELETE, dels).rowcount, 0)
    if puts:
        conn.executemany(INSERT, puts)
    if upds:
        conn.executemany(UPDATE, upds)
    return deleted


def _apply_ids(conn: sqlite3.Connection, net: dict[IdKey, int | None]) -> int:
    """Execute folded id operations (msg id: keep, in the dict's order; None: forget); rows
    deleted."""
    if not net:
        return 0
    dels = [key for key, msg_id in net.items() if msg_id is None]
    puts = [(*key, msg_id) for key, msg_id in net.items() if msg_id is not None]
    deleted = max(conn.executemany(DELETE_ID, dels).rowcount, 0) if dels else 0
    if puts:
        conn.executemany(PUT_ID, puts)
    return deleted


def read_messages(rows: Iterable[tuple]) -> Iterator[Message]:
    """Messages from SELECT_MESSAGES-shaped rows; consecutive copies share headers and body."""
    last: tuple[int, str, dict[str, str], bytes] | None = None
    for msg_id, queue_, address, text, count, grp, seq, enq, body in rows:
        if last is not None and last[0] == msg_id and last[1] == text:
            headers = last[2]
            body = last[3] if last[3] == body else body
        else:
            headers = json.loads(text)
        last = (msg_id, text, headers, body)
        yield Message(
            msg_id=msg_id,
            queue=queue_,
            address=address,
            body=body,
            headers=headers,
            persistent=True,
            delivery_count=count,
            group=grp,
            group_seq=seq,
            enqueued_ns=enq,
        )
