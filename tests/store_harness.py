"""What the store's tests share: messages to store, a blocked writer, a fresh store."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from broker.message import Message
from broker.store import Store

KIB = 1024


def msg(msg_id: int, queue: str = "q", body: bytes = b"x", **kw: object) -> Message:
    kw.setdefault("persistent", True)
    return Message(msg_id=msg_id, queue=queue, address="addr", body=body, **kw)  # type: ignore[arg-type]


def naming(path: Path, problem: str) -> str:
    """A `match=` pattern: the error names the file, then the problem (a regex)."""
    return re.escape(str(path)) + ".*" + problem


def by_key(messages: list[Message]) -> dict[tuple[str, int], Message]:
    return {(m.queue, m.msg_id): m for m in messages}


@contextlib.contextmanager
def writer_blocked(path: Path) -> Iterator[None]:
    """Hold SQLite's write lock from another connection, so that calls made meanwhile queue
    up behind the writer thread and are committed together once it is released."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


async def let_tasks_run() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = Store.open(tmp_path / "data" / "store.db")
    yield s
    await s.close()
