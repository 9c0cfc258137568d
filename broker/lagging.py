"""A queue's most lagging groups, found without walking all of them.

An operator with a million groups wants the few that are stuck: the deepest backlogs and
the oldest waiting messages. Walking every group per scrape would make a scrape cost what the
queue holds, so the queue keeps candidates as messages move and this module ranks them:

- groups whose backlog doubled past a threshold (the queue's `_deep`, see broker/dispatch.py):
  every deep group is there, whatever its state;
- the first groups of each run queue: dispatch serves a run queue oldest first, so its head
  holds the groups whose oldest message has waited longest for that consumer (or, for the
  `unowned` run queue, for any consumer);
- the first held groups (held the longest): nothing of theirs moves until their binding is
  confirmed.

So a group is missed only if its backlog stays under the threshold and it sits behind `scan`
others in its run queue: it then waits less than those shown. Pure: ages are read from
`oldest_ns` by whoever shows them.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from itertools import islice

from broker.group_state import HELD, Group
from broker.info import LaggingGroup


def heads(run: Iterable[Group], scan: int) -> Iterable[Group]:
    """The live entries among the first `scan` of a run queue (stale ones are skipped:
    see broker/dispatch.py)."""
    return (g for g in islice(run, scan) if g.slot is run and g.pending is not None)


def waiting(held: Iterable[Group], scan: int) -> Iterable[Group]:
    """The groups among the first `scan` held ones that have messages waiting."""
    return (g for g in islice(held, scan) if g.pending is not None or g.page)


def rank(candidates: Iterable[Group], k: int) -> tuple[list[LaggingGroup], list[LaggingGroup]]:
    """The top `k` by backlog and the top `k` by the age of their oldest waiting message in
    memory (a group whose oldest is paged has no age here: it shows by its backlog)."""
    live = [g for g in {id(g): g for g in candidates}.values() if g.pending is not None or g.page]
    deepest = heapq.nsmallest(k, live, key=lambda g: (-g.backlog(), g.key))
    aged = [g for g in live if g.pending is not None]
    oldest = heapq.nsmallest(k, aged, key=_oldest)
    by_backlog, by_age = [_row(g) for g in deepest], [_row(g) for g in oldest]
    return by_backlog, by_age


def _oldest(g: Group) -> tuple[int, str]:
    return g.pending[0].enqueued_ns, g.key  # type: ignore[index]


def _row(g: Group) -> LaggingGroup:
    pending = g.pending
    return LaggingGroup(
        group=g.key,
        backlog=g.backlog(),
        oldest_ns=pending[0].enqueued_ns if pending else 0,
        owner_name=g.owner.name if g.owner is not None else None,
        held=bool(g.state & HELD),
    )
