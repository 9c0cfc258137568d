"""How much memory messages hold, per address and node-wide, and what a send gets when an
address is full (pure).

A queue counts the messages it holds on its address's `Meter`, which also counts them on
the node's. An address is full when it holds more than its `max-size-bytes`, or the node
more than `limits.global-max-size`; a send to it then gets its `address-full-policy`:
PAGE keeps persistent messages on disk only (broker/queue.py), BLOCK waits for room, FAIL
refuses. A send of a persistent message while the data volume is above
`limits.max-disk-usage` is blocked (BLOCK) or refused (otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from broker.config import NodeConfig
from broker.message import Message

# What a held message costs beyond its body and header text: the Message object, its ints,
# the body's and each header's string objects and dict slots (measured: bench/group_memory.py).
MESSAGE_OVERHEAD = 200
HEADER_OVERHEAD = 130

Policy = Literal["PAGE", "BLOCK", "FAIL"]


def footprint(m: Message) -> int:
    """The bytes a message is counted for while it is held in memory."""
    headers = m.headers
    if not headers:
        return MESSAGE_OVERHEAD + len(m.body)
    return (
        MESSAGE_OVERHEAD
        + len(m.body)
        + HEADER_OVERHEAD * len(headers)
        + sum(map(len, headers))
        + sum(map(len, headers.values()))
    )


class Meter:
    """Bytes held by the queues of one address, also counted on the node's meter."""

    __slots__ = ("bytes", "limit", "node", "policy")

    def __init__(self, limit: int = -1, policy: Policy = "PAGE", node: Meter | None = None) -> None:
        self.bytes = 0
        self.limit = limit  # -1: none of its own
        self.policy: Policy = policy
        self.node = node

    def add(self, n: int) -> None:
        self.bytes += n
        if self.node is not None:
            self.node.bytes += n

    def room(self) -> int:
        """Bytes that may still be added before the address or the node is full."""
        own = self.limit - self.bytes if self.limit >= 0 else 1 << 62
        return min(own, self.node.room()) if self.node is not None else own

    @property
    def full(self) -> bool:
        node = self.node
        return (0 <= self.limit < self.bytes) or (node is not None and node.full)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a send may not go in now, and whether it waits (BLOCK) or fails."""

    block: bool
    reason: str


class Budget:
    """The node's meters and its disk state; `refusal` judges a send before it is routed."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.node = Meter(config.limits.global_max_size)
        self.disk_full = False
        self.disk_percent = 0.0
        self._meters: dict[str, Meter] = {}

    def meter(self, address: str) -> Meter:
        """The meter of an address, made on first use from its address-settings."""
        m = self._meters.get(address)
        if m is None:
            rules = self.config.settings_for(address)
            limit, policy = rules.memory_limit(address not in self.config.addresses)
            m = self._meters[address] = Meter(limit, policy, self.node)
        return m

    def forget(self, address: str) -> None:
        """The address is gone (it holds nothing any more)."""
        m = self._meters.get(address)
        if m is not None and m.bytes == 0:
            del self._meters[address]

    def refusal(self, address: str, persistent: bool, pageable: bool) -> Refusal | None:
        """None if a send to `address` may go in now (perhaps to be paged).

        `pageable`: every queue of the address is durable, so its messages can be paged.
        """
        m = self.meter(address)
        if persistent and self.disk_full:
            return Refusal(
                m.policy == "BLOCK",
                f"the data volume is {self.disk_percent:.0f}% full, above limits.max-disk-usage "
                f"({self.config.limits.max_disk_usage}%): persistent sends wait until consumers "
                "free space",
            )
        if not m.full or (m.policy == "PAGE" and persistent and pageable):
            return None
        if 0 <= m.limit < m.bytes:
            what = f"address {address!r} holds {m.bytes} bytes, above max-size-bytes ({m.limit})"
        else:
            what = (
                f"the node holds {self.node.bytes} bytes of messages, above "
                f"limits.global-max-size ({self.node.limit})"
            )
        if m.policy == "PAGE":
            why = (
                "a queue is not durable" if persistent else "non-persistent messages are not paged"
            )
            return Refusal(False, f"{what}: address-full-policy PAGE, but {why}")
        return Refusal(m.policy == "BLOCK", f"{what} (address-full-policy {m.policy})")
