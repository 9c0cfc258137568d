"""Driving the pure cores in tests: a `Queue` with its own message ids and clock, every call
returning its Effects, and a `BrokerCore` from a minimal YAML config.
"""

from __future__ import annotations

from typing import Any

from broker.config import QueueConfig
from broker.config_file import parse_config
from broker.core import (
    BrokerCore,
)
from broker.effects import Delivery, Effects
from broker.group_state import state_name
from broker.message import GROUP_ID_HEADER, GROUP_SEQ_HEADER, Message
from broker.queue import Queue

MS = 1_000_000  # ns per ms


class Harness:
    """A `Queue` plus a message-id counter and a clock; every call returns its Effects."""

    def __init__(self, **settings: Any) -> None:
        self.q = Queue("q", "q", QueueConfig(**settings))
        self.next_id = 1
        self.now = 0
        self.log: list[Delivery] = []

    def _run(self, op: Any, *args: Any) -> Effects:
        fx = Effects()
        op(*args, self.now, fx)
        self.log += fx.deliveries
        return fx

    def send(
        self, group: str | None = None, seq: int | None = None, **headers: str
    ) -> tuple[Message, Effects]:
        if group is not None:
            headers[GROUP_ID_HEADER] = group
        if seq is not None:
            headers[GROUP_SEQ_HEADER] = str(seq)
        body = f"{group}#{self.next_id}".encode()
        m = Message(self.next_id, "q", "q", body, headers, enqueued_ns=self.now)
        self.next_id += 1
        return m, self._run(self.q.enqueue, m)

    def sub(self, cid: str, prefetch: int = 100) -> Effects:
        return self._run(self.q.subscribe, cid, cid, prefetch)

    def close(self, cid: str) -> Effects:
        return self._run(self.q.close_consumer, cid)

    def ack(self, cid: str, ids: list[int] | None = None) -> Effects:
        return self._run(self.q.ack, cid, self.ids(cid) if ids is None else ids)

    def release(self, cid: str, ids: list[int]) -> Effects:
        return self._run(self.q.release, cid, ids)

    def reject(self, cid: str, ids: list[int]) -> Effects:
        return self._run(self.q.reject, cid, ids)

    def reset(self, group: str | None) -> Effects:
        return self._run(self.q.reset_groups, group)

    def tick(self) -> Effects:
        return self._run(self.q.tick)

    def ids(self, cid: str) -> list[int]:
        return [did for did, _ in self.q.unacked(cid)]

    def held_by(self, cid: str) -> list[int]:
        """Message ids the consumer holds unacknowledged, in delivery order."""
        return [m.msg_id for _, m in self.q.unacked(cid)]

    def state(self, group: str) -> str | None:
        """The group's state (`OWNED`, `DETACHING+HELD`, ...); None once it is forgotten."""
        g = self.q._groups.get(group)
        return None if g is None else state_name(g.state)

    def owner(self, group: str) -> str | None:
        owners = {g.group: g.owner for g in self.q.groups()}
        return owners.get(group)


def to(fx: Effects, cid: str) -> list[int]:
    """Message ids delivered to `cid` in these effects, in order."""
    return [d.message.msg_id for d in fx.deliveries if d.consumer_id == cid]


def consumers_of(fx: Effects) -> set[str]:
    return {d.consumer_id for d in fx.deliveries}


def core_from(yaml_tail: str = "") -> BrokerCore:
    return BrokerCore(parse_config("node: {id: n1}\n" + yaml_tail, "t"))
