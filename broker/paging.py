"""A queue's paging: which of its messages are on disk only, and which to read back or spill.

Paging is per group: from a group's first paged message on, every later one of the group is
paged too until all are read back, or it would overtake them (ungrouped messages page the
same way, as one FIFO of their own). A group with paged messages and none in memory wants to
be read back; `wanted` picks those that could be delivered now. When memory is wanted
elsewhere, `spill` pages again the newest waiting messages of groups that cannot move now.

Only msg ids are kept here (a group's `Page`, 8 bytes each); the messages are in the store.
The queue owns the messages in memory and their counts: this module only takes messages out
of a group's FIFO (`spill`) and drops from a page the ids read back (`read`); the queue counts
them and puts them in memory.
"""

from __future__ import annotations

from array import array
from collections.abc import Collection, Container, Iterable, Sequence

from broker.group_state import HELD, Consumer, Group, Page, by_key
from broker.message import Message


class Paging:
    """One queue's paged messages (see the module doc)."""

    __slots__ = ("count", "last", "ungrouped", "wanting")

    def __init__(self) -> None:
        self.count = 0  # paged messages, in all
        self.last = 0  # msg id of the newest paged message
        self.ungrouped = Page()
        # Groups to read back: they had paged messages and none in memory when they came in.
        self.wanting: dict[Group, None] = {}

    def add(self, g: Group | None, m: Message) -> None:
        """A message of `g` (None: ungrouped) stays on disk only, behind the group's paged ones,
        as persistent; its store write is the caller's."""
        m.persistent = True
        self.add_id(g, m.msg_id)

    def add_id(self, g: Group | None, msg_id: int) -> None:
        """`add` of a message already in the store, by its id alone."""
        self.count += 1
        self.last = msg_id
        if g is None:
            self.ungrouped.append(msg_id)
            return
        if g.page is None:
            g.page = Page()
        g.page.append(msg_id)
        if g.pending is None:
            self.wanting[g] = None

    def add_ids(self, g: Group, msg_ids: array) -> None:
        """`add_id` of a run of stored messages of `g` at start-up (ascending)."""
        self.count += len(msg_ids)
        self.last = max(self.last, msg_ids[-1])
        if g.page is None:
            g.page = Page()
        g.page.extend(msg_ids)
        if g.pending is None:
            self.wanting[g] = None

    def want(self, g: Group) -> None:
        """A group with paged messages has none left in memory: read it back when it can move."""
        self.wanting[g] = None

    def wanted(
        self,
        most: int,
        each: int,
        hungry: Collection[Consumer],
        held: Iterable[Group],
        ungrouped_waiting: bool,
    ) -> list[tuple[str | None, list[int]]]:
        """See `Queue.wanted`; `hungry`: the consumers with credit; `held`: the held groups;
        `ungrouped_waiting`: ungrouped messages wait in memory."""
        out: list[tuple[str | None, list[int]]] = []
        if not hungry:
            # Nobody could take them, but a held group comes back to be moved on (or kept): a
            # restart restores groups paged, and a cluster holds them until their bindings
            # are known. Only the held ones are looked at: there are few, but for a moment.
            wanting = self.wanting
            groups: Iterable[Group] = (g for g in held if g in wanting)
        else:
            if self.ungrouped and not ungrouped_waiting:
                out.append((None, self.ungrouped.front(each)))
            groups = self.wanting
        for g in groups:
            if len(out) >= most:
                break
            if g.state & HELD or g.owner is None or g.owner in hungry:
                out.append((g.key, g.page.front(each)))  # type: ignore[union-attr]
        return out

    def read(self, g: Group | None, msg_ids: Sequence[int]) -> bool:
        """`msg_ids` of a group (g None: ungrouped) were read back: they leave its page, if it
        still starts with them; False (nothing done) if another read or a deletion won."""
        page = self.ungrouped if g is None else g.page
        if not page or page.front(len(msg_ids)) != list(msg_ids):
            return False
        page.drop(len(msg_ids))
        self.count -= len(msg_ids)
        if g is not None:
            if not page:
                g.page = None
            self.wanting.pop(g, None)
        return True

    def spill(
        self,
        consumers: Iterable[Consumer],
        hungry: Container[Consumer],
        writing: Container[int],
        wanted_bytes: int,
    ) -> list[Message]:
        """See `Queue.spill`: takes the messages out of their groups' FIFOs and pages them; the
        caller uncounts them."""
        freed = 0
        out: list[Message] = []
        for c in consumers:
            if c in hungry:
                continue
            for g in by_key(c.groups):
                pending = g.pending
                if g.state & HELD or not pending:
                    continue
                spilled = 0
                while pending and freed < wanted_bytes:
                    m = pending[-1]
                    if not m.persistent or m.delivery_count or m.msg_id in writing:
                        break
                    pending.pop()
                    out.append(m)
                    freed += m.size
                    spilled += 1
                if spilled:
                    self.count += spilled
                    if g.page is None:
                        g.page = Page()
                    g.page.push_front([x.msg_id for x in reversed(out[-spilled:])])
                    if not pending:
                        g.pending = None
                        self.wanting[g] = None
                if freed >= wanted_bytes:
                    return out
        return out
