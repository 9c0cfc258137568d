"""Duplicate detection (Artemis' `_AMQ_DUPL_ID`): the ids of the messages an address accepted
last, so that a message sent again with one of them is acknowledged and dropped.

A producer that lost the answer to a send cannot tell whether it was enqueued; it sends again
with the same id and the node drops the copy instead of enqueueing it twice. The cache is per
address and holds the `limits.id-cache-size` most recent ids of each (the oldest goes first,
like Artemis' circular id cache); size 0 turns detection off.

Pure: no I/O and no clock. What the store must follow leaves as `Change`s (an id kept, or one
evicted), which the core puts in the Effects of the send: the engine writes them in the same
transaction as the messages, so an id is on disk exactly when its message is, and the store's
table stays as bounded as the cache. Only ids of persistent messages are stored; the others
live in memory only, like their messages.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence

MAX_ID_CHARS = 64  # a longer id is kept as a digest: an entry's size never depends on a client
_DIGEST_PREFIX = "~blake2b:"  # 9 + 48 hex characters: fits MAX_ID_CHARS, never hashed again

# What the store must do for one id: (address, id key, msg id) keep it, msg id None: forget it.
Change = tuple[str, str, int | None]


def id_key(dup_id: str) -> str:
    """The id as the cache keeps it: itself, or a digest of it when it is long."""
    if len(dup_id) <= MAX_ID_CHARS:
        return dup_id
    digest = hashlib.blake2b(dup_id.encode("utf-8", "surrogatepass"), digest_size=24)
    return _DIGEST_PREFIX + digest.hexdigest()


class IdCache:
    """Per address, the most recent accepted ids with their message's msg id, oldest first.

    `seen` answers without changing anything (a batch may be looked at again after awaiting a
    grouping decision); `add` records an id once its message is routed.
    """

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError("an id cache size is 0 (off) or more")
        self.size = size
        # address -> id key -> (msg id of the accepted message, stored: its id is on disk)
        self._ids: dict[str, OrderedDict[str, tuple[int, bool]]] = {}

    def __len__(self) -> int:
        """Ids held, all addresses together."""
        return sum(len(ids) for ids in self._ids.values())

    def original(self, address: str, dup_id: str) -> int | None:
        """The msg id of the message accepted with this id, if the address still holds it."""
        ids = self._ids.get(address)
        if ids is None or not dup_id:
            return None
        entry = ids.get(id_key(dup_id))
        return None if entry is None else entry[0]

    def screen(self, batch: Sequence[tuple[str, str | None]]) -> list[bool]:
        """Which messages of a batch, given as (address, id or None), are duplicates.

        A duplicate carries an id its address holds, or one an earlier message of the same
        batch to the same address carries (the later one is dropped too, whatever the size).
        A message without an id (or with an empty one) is never a duplicate.
        """
        if not self.size:
            return [False] * len(batch)
        in_batch: set[tuple[str, str]] = set()
        found: list[bool] = []
        for address, dup_id in batch:
            if not dup_id:
                found.append(False)
                continue
            key = id_key(dup_id)
            ids = self._ids.get(address)
            found.append((ids is not None and key in ids) or (address, key) in in_batch)
            in_batch.add((address, key))
        return found

    def add(self, address: str, dup_id: str, msg_id: int, stored: bool) -> list[Change]:
        """Remember an accepted message's id; `stored`: its message is persistent, so the id
        goes to the store too. Returns what the store must do (nothing for an empty id)."""
        if not self.size or not dup_id:
            return []
        return self._put(address, id_key(dup_id), msg_id, stored)

    def load(self, entries: Iterable[tuple[str, str, int]]) -> list[Change]:
        """Ids read back from the store (address, id key, msg id), oldest first.

        Returns the forgetting of those that no longer fit (`limits.id-cache-size` lowered, or
        0), so the store's table shrinks to what the cache holds.
        """
        changes: list[Change] = []
        for address, key, msg_id in entries:
            if self.size:
                changes += [c for c in self._put(address, key, msg_id, True) if c[2] is None]
            else:
                changes.append((address, key, None))
        return changes

    def _put(self, address: str, key: str, msg_id: int, stored: bool) -> list[Change]:
        ids = self._ids.get(address)
        if ids is None:
            ids = self._ids[address] = OrderedDict()
        ids[key] = (msg_id, stored)
        ids.move_to_end(key)
        changes: list[Change] = [(address, key, msg_id)] if stored else []
        while len(ids) > self.size:
            old, (_, was_stored) = ids.popitem(last=False)
            if was_stored:
                changes.append((address, old, None))
        return changes
