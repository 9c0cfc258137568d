"""The grouping handler's record: a binding of a group to a queue instance, and its keys.

A leaf every module of the handler (and the cluster code above it) shares: the interface
(`handler/api.py`), the arbiter, the bindings file, both handlers and the wire conversions.
"""

from __future__ import annotations

from dataclasses import dataclass

Key = tuple[str, str]  # (group, queue)
Instance = tuple[str, str]  # (queue, node)


@dataclass(frozen=True, slots=True)
class Binding:
    """A decided route: messages of `group` sent to `queue` go to the instance on `node`.

    `epoch` is the term of the arbiter that accepted it; answers of an older epoch never win
    over newer ones.
    """

    group: str
    queue: str
    node: str
    epoch: int

    @property
    def key(self) -> Key:
        return (self.group, self.queue)

    @property
    def instance(self) -> Instance:
        return (self.queue, self.node)
