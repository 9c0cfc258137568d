"""An address of one node and the queues bound to it: which queues a message goes to (pure).

Multicast copies a message to every queue of its address. Anycast with several queues picks
one round robin, except that a group stays where its first message went (`pins`), so a group
never splits across queues of one address.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

RoutingType = Literal["anycast", "multicast"]


@dataclass(slots=True)
class Address:
    name: str
    routing_type: RoutingType
    queues: list[str] = field(default_factory=list)
    next_queue: int = 0
    # anycast with several queues: which queue each group went to, so a group never splits
    pins: dict[str, str] = field(default_factory=dict)

    def targets(self, group: str | None) -> list[str]:
        """The queues a message of `group` (None: ungrouped) goes to."""
        queues = self.queues
        if self.routing_type == "multicast" or len(queues) <= 1:
            return queues
        if group is not None and group in self.pins:
            return [self.pins[group]]
        name = queues[self.next_queue % len(queues)]
        self.next_queue += 1
        if group is not None:
            self.pins[group] = name
        return [name]

    def pin(self, group: str | None, queue: str) -> None:
        """A stored message of `group` is in `queue`: the group's later messages follow it."""
        if group is not None and self.routing_type == "anycast" and len(self.queues) > 1:
            self.pins[group] = queue

    def remove(self, queue: str) -> None:
        self.queues.remove(queue)
        self.pins = {k: v for k, v in self.pins.items() if v != queue}
