"""The message store as an append-only journal (`store.format: journal`): the writer thread of
`broker/store_base.py` over the segment files of `broker/journal.py`.

What it gives up against the SQLite format: a file ops can open with the `sqlite3` shell, and
ha replication (a pair's nodes use the SQLite format; the config refuses the two together).
What it buys: see `broker/journal.py` and bench/RESULTS.md.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import structlog

from broker.journal import SEGMENT_BYTES, Journal
from broker.message import Message
from broker.store_base import StoreBase
from broker.store_reads import StoreError
from broker.store_writes import StoreWrite

log = structlog.get_logger(__name__)

_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})


class JournalStore(StoreBase[Journal]):
    """The store in a journal directory; build with `JournalStore.open(path)`."""

    def __init__(
        self, path: Path, journal: Journal, on_full: Callable[[], bool] | None = None
    ) -> None:
        super().__init__(path, on_full)
        self._journal = journal
        self._roll_failed = False  # the last roll failed, and that was logged

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        max_bytes: int | None = None,
        on_full: Callable[[], bool] | None = None,
        segment_bytes: int = SEGMENT_BYTES,
    ) -> JournalStore:
        """Replay the journal in directory `path` (created if missing) and start the writer.

        Raises `StoreError` (naming the file) if it is not an intact journal. `max_bytes`
        optionally caps the journal's size, beyond which writes fail (or wait, with
        `on_full`: see `StoreBase`); rolling a segment may pass it by that segment's live
        operations for a moment.
        """
        path = Path(path)
        journal = Journal.open(path, segment_bytes=segment_bytes, max_bytes=max_bytes)
        store = cls(path, journal, on_full)
        store._start(lambda: journal)
        return store

    # ------------------------------------------------------------------ reads

    def messages(self) -> Iterator[Message]:
        return self._journal.messages()

    def message_count(self) -> int:
        return self._journal.message_count()

    def load_queues(self) -> list[tuple[str, str, dict[str, Any]]]:
        return self._journal.load_queues()

    def read_ids(self, queue: str, wanted: Sequence[Sequence[int]]) -> list[list[Message]]:
        try:
            return self._journal.read_ids(queue, wanted)
        except OSError as exc:
            raise StoreError(f"{self.path}: read failed: {exc}") from exc

    def load_marks(self) -> dict[str, int]:
        return self._journal.load_marks()

    def load_ids(self) -> list[tuple[str, str, int]]:
        return self._journal.load_ids()

    def store_id(self) -> int:
        return self._journal.store_id

    def max_msg_id(self) -> int:
        return self._journal.max_id

    def disk_bytes(self) -> int:
        return self._journal.disk_bytes()

    # ------------------------------------------------------------------ writer thread

    def _commit(self, journal: Journal, records: list[StoreWrite]) -> None:
        journal.append(records)

    def _no_room(self, exc: BaseException) -> bool:
        return isinstance(exc, OSError) and exc.errno in _NO_ROOM

    def _housekeep(self, journal: Journal) -> None:
        """Roll old segments while they are due and nobody waits to write."""
        wanted = self._compaction_wanted
        try:
            # One segment per batch under load (the journal must not outgrow it), all that
            # are due while idle.
            for _ in range(journal.segment_count()):  # each at most once
                if not journal.roll_due(wanted):
                    break
                journal.roll()
                self.compactions += 1
                if not self._requests.empty():
                    return
        except (OSError, StoreError) as exc:
            if not self._roll_failed:  # once per run of failures, not once per batch
                log.warning(
                    "journal: rolling a segment failed", path=str(self.path), error=str(exc)
                )
                self._roll_failed = True
            return
        if self._roll_failed:
            log.info("journal: rolling segments works again", path=str(self.path))
            self._roll_failed = False
        self._compaction_wanted = False

    def _finish(self, journal: Journal) -> BaseException | None:
        self._housekeep(journal)
        try:
            journal.close()
        except OSError as exc:
            return StoreError(f"{self.path}: close failed: {exc}")
        return None
