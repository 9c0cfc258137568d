"""What the node's send path and the cluster code see of a grouping handler, LOCAL or REMOTE.

The send path calls `cached()` first (synchronous, no I/O: the per-message cost) and only on
a miss awaits `decide()` with the instance its router picked. The cluster topology reports
queue instances with `instance_seen` / `instance_deleted` (only the LOCAL handler acts on
them); an ha primary replicates the LOCAL handler's `bindings_store`. `on_removed` callbacks
let the node unpin a group whose binding went away.

The interface imports nothing of either handler (an import-linter contract in pyproject.toml):
the LOCAL one's gRPC service is built and hosted by `handler/factory.py`.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

import structlog

from handler.records import Binding
from handler.stats import HandlerStats

if TYPE_CHECKING:
    from handler.bindings import BindingStore

__all__ = [
    "LIST_LIMIT",
    "Binding",
    "BindingUse",
    "DecisionTimeout",
    "GroupingHandler",
    "HandlerUnavailable",
    "RemovalReason",
    "RemovedCallback",
]

log = structlog.get_logger(__name__)

LIST_LIMIT = 10_000  # bindings per list_bindings call by default (one gRPC reply: < 4 MB)


class RemovalReason(enum.StrEnum):
    """Why a binding went away."""

    REAPED = "reaped"  # unused for longer than group-timeout
    UNBOUND = "unbound"  # an operator unbound it
    INSTANCE_DELETED = "instance-deleted"  # its queue instance was deleted
    INSTANCE_ABSENT = "instance-absent"  # its instance was missing for longer than timeout
    STALE = "stale"  # REMOTE only: the LOCAL node no longer holds it (a removal was missed)


RemovedCallback = Callable[[Binding, RemovalReason], None]


class BindingUse(NamedTuple):
    """A binding as operators list it."""

    binding: Binding
    last_use_unix_ms: int


class DecisionTimeout(Exception):
    """No binding could be decided within the handler's timeout; the send must fail."""


class HandlerUnavailable(Exception):
    """An operator call (list, unbind) could not reach the LOCAL grouping handler."""


class GroupingHandler(abc.ABC):
    """The interface both handlers implement, plus the removal-callback plumbing they share."""

    def __init__(self) -> None:
        self._callbacks: list[RemovedCallback] = []
        self._lapse_callbacks: list[Callable[[], None]] = []
        self.stats = HandlerStats()  # for /metrics (handler/stats.py)

    @abc.abstractmethod
    async def start(self) -> None:
        """Load state and start background tasks; returns without waiting for the cluster."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop background tasks and release files and connections."""

    @abc.abstractmethod
    async def decide(self, group: str, queue: str, proposal_node: str) -> Binding:
        """The binding for (group, queue); proposes `proposal_node` if there is none.

        Raises `DecisionTimeout` when no decision arrives within the configured timeout. The
        answer holds when given: a caller acting on it after further awaits reads it again
        with `cached()` in the step that acts, since a removal may have been reported
        (`on_removed`) in between.
        """

    @abc.abstractmethod
    def cached(self, group: str, queue: str) -> Binding | None:
        """The binding if it is known here without I/O (and counts as a use), else None."""

    @abc.abstractmethod
    async def list_bindings(
        self, group: str | None = None, limit: int = LIST_LIMIT
    ) -> list[BindingUse]:
        """Bindings (of one group) with their last use, as the LOCAL node knows them.

        At most `limit` of them (0: no limit), least recently used first.
        """

    @abc.abstractmethod
    async def unbind(self, group: str, queue: str | None = None) -> int:
        """Remove a group's binding on `queue` (every queue when None); how many went."""

    def instance_seen(self, queue: str, node: str, present: bool) -> None:  # noqa: B027
        """Topology report: queue@node exists (True) or went missing (False)."""

    def instance_deleted(self, queue: str, node: str) -> None:  # noqa: B027
        """Topology report: queue@node was deleted; its bindings go at once."""

    def report_instances(self, instances: Mapping[tuple[str, str], bool]) -> None:  # noqa: B027
        """Topology snapshot: every known (queue, node) -> whether its node is connected.

        Connected ones count as present, the others as absent; an instance listed in an
        earlier snapshot and missing from this one counts as deleted.
        """

    @property
    def bindings_store(self) -> BindingStore | None:
        """The bindings file this handler keeps, once started; None for REMOTE (no file)."""
        return None

    def on_removed(self, callback: RemovedCallback) -> None:
        """Call `callback(binding, reason)` on the event loop for every removed binding."""
        self._callbacks.append(callback)

    def _notify(self, removed: list[Binding], reason: RemovalReason) -> None:
        for binding in removed:
            for callback in self._callbacks:
                try:
                    callback(binding, reason)
                except Exception:
                    log.exception("on_removed callback failed", group=binding.group)

    def on_lease_lapsed(self, callback: Callable[[], None]) -> None:
        """Call `callback()` when this node's lease from the arbiter lapses (REMOTE only): it
        must deliver no grouped message until decisions come again."""
        self._lapse_callbacks.append(callback)

    def _lapsed(self) -> None:
        for callback in self._lapse_callbacks:
            try:
                callback()
            except Exception:
                log.exception("on_lease_lapsed callback failed")
