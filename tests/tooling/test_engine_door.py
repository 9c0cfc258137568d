"""The engine is the one door to a node's core: no module above it changes the core itself.

Protocol shells, the cluster and the grouping handlers change a node only through the
engine's commands (`Engine.unit()`, `create_queue`, `delete_queue`), so that every effect is
applied, audited and fenced in one place. This test reads the source of every module above
the engine (pinmq/, cluster/, handler/) and fails on a way around it:

- any access to an attribute named `core` or `_core` (the engine's core), or an import of
  `BrokerCore` or `Queue`;
- any call of the engine's (or, as it used to be called, the node's) `apply` or `_apply`, or
  access to the engine's consumer streams (`streams`, `_outlets`);
- a call of a core or queue mutator's name (found by introspection of BrokerCore and Queue,
  so a new mutator is covered at once) on anything but a unit or the engine, unless it is
  one of the few other objects that happen to have a method of that name, listed below.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO

from broker.core import BrokerCore
from broker.engine import Engine
from broker.queue import Queue
from broker.unit import Unit

ROOT = REPO
ABOVE = ("pinmq", "cluster", "handler")
# What the layers above may call on the core's objects: reads, no change.
QUERIES = {
    "queue", "queues", "queues_of", "exists", "check_address", "duplicates", "admit",
    "idle_queues", "is_idle", "counts", "groups", "consumers", "has_group", "consumer_groups",
    "unacked", "group_key", "held_waiting", "held", "wanted", "lagging",
}  # fmt: skip
# Other objects whose methods share a mutator's name: (receiver, method).
OTHERS = {
    ("message", "ack"),  # the Python client's Received (pinmq/cli.py)
    ("client", "reset_groups"),  # the Python client's admin call (pinmq/cli.py)
    ("client", "create_queue"),  # and another (pinmq/load.py)
    ("producer", "send"),  # the Python client's producer (pinmq/load.py)
    ("consumer", "ack"),  # the STOMP client's consumer (pinmq/stomp_client.py)
    ("parser", "release"),  # the STOMP frame parser frees its buffer
    ("member", "tick"),  # the failover state machine (cluster/ha.py)
    ("handler", "subscribe"),  # the LOCAL handler's removal subscriptions
    ("sqlite_file", "enqueue"),  # the SQLite writer thread's request queue
    ("sending", "send"),  # the send path seam (broker/sending.py)
    ("sender", "send"),
}
DOORS = ("unit", "engine")  # receivers through which the core may be changed


def _public_methods(cls: type) -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and (inspect.isfunction(member))
    }


MUTATORS = (_public_methods(BrokerCore) | _public_methods(Queue)) - QUERIES


def _receiver(node: ast.expr) -> str:
    """The last name of a call's receiver: `self.engine.unit()` -> 'unit'."""
    while isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def violations(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) for every way around the engine in one module's source."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("core", "_core"):
            yield node.lineno, f"reaches the core: .{node.attr}"
        elif isinstance(node, ast.Attribute) and node.attr in ("streams", "_outlets"):
            yield node.lineno, f"reaches the consumer streams: .{node.attr}"
        elif isinstance(node, ast.ImportFrom) and node.module in ("broker.core", "broker.queue"):
            for alias in node.names:
                if alias.name in ("BrokerCore", "Queue"):
                    yield node.lineno, f"imports {node.module}.{alias.name}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            receiver = _receiver(node.func.value).lstrip("_")
            if name in ("apply", "_apply") and receiver.endswith(("engine", "node")):
                yield node.lineno, f"applies Effects itself: .{name}()"
            elif (
                name in MUTATORS and not receiver.endswith(DOORS) and (receiver, name) not in OTHERS
            ):
                yield node.lineno, f"calls a core mutator: {receiver}.{name}()"


def modules_above() -> list[Path]:
    return sorted(p for package in ABOVE for p in (ROOT / package).rglob("*.py"))


def test_the_mutator_list_is_read_from_the_core() -> None:
    assert {"subscribe", "ack", "deliver_to", "hold_group", "enqueue", "take_group"} <= MUTATORS
    assert not MUTATORS & {"queue", "groups", "has_group"}
    # Every command a unit or the engine offers for the layers above is a door, not a leak.
    commands = _public_methods(Unit) | _public_methods(Engine)
    assert {"subscribe", "settle", "unsubscribe", "route", "place", "create_queue"} <= commands


@pytest.mark.parametrize(
    "snippet",
    [
        "engine.core.ack('q', 'c', [1], 0)",
        "self._core.queue('q')",
        "engine.apply(fx)",
        "engine.streams['c'] = stream",
        "from broker.core import BrokerCore",
        "q = engine.queue('q')\nq.hold('g')",
        "queue.enqueue(m, 0, fx)",
    ],
)
def test_the_checker_catches_a_way_around_the_engine(snippet: str) -> None:
    assert list(violations(snippet)), snippet


def test_the_checker_lets_the_engine_commands_through() -> None:
    ok = (
        "with engine.unit() as unit:\n    unit.settle(stream, 'ack', ids)\n"
        "self.unit.subscribe('q', 'c', 'n', 10)\n"
        "await self.engine.create_queue('a', 'q', settings)\n"
        "q = engine.queue('q')\nq.groups()\n"
    )
    assert list(violations(ok)) == []


def test_no_module_above_the_engine_changes_the_core_itself() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in modules_above()
        for line, what in violations(path.read_text())
    ]
    assert len(modules_above()) > 30  # the packages were found
    assert found == [], "\n".join(found)
