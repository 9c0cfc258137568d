"""Whether a node can take work, decided from plain facts (pure): the answer of `GET /readyz`.

A node is ready when it serves (started, not stopping, no fatal error), its store is open, and,
in a cluster, it can route a new group: no cluster-wide misconfiguration, and the LOCAL grouping
handler is this node or a peer it is linked to. Peers that are down are reported, not required:
a node cut off from one peer still serves, and messages for that peer wait in store-and-forward.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Readiness:
    """Whether the node takes work, the reasons it does not, and the facts (the JSON body)."""

    ready: bool
    details: dict[str, Any]


def role(clustered: bool, handler_type: str | None) -> str:
    """What the node is to the cluster, in one word for health output and logs."""
    if not clustered:
        return "standalone"
    if handler_type == "LOCAL":
        return "arbiter"
    return "remote" if handler_type == "REMOTE" else "member"


def assess(
    *,
    node_id: str,
    serving: bool,
    store_open: bool,
    failed: str | None,
    clustered: bool,
    handler_type: str | None,
    local_handler: str | None,
    peers: Mapping[str, bool],
    problems: list[str],
    resources: Mapping[str, Any] | None = None,
    ha: Mapping[str, Any] | None = None,
) -> Readiness:
    """Readiness from the node's facts; `peers` maps each known peer to whether it is linked.

    `resources` (memory, paging, disk, blocked producers) is reported, not judged: a full
    node still serves its consumers, which is how it gets room again.
    """
    reasons: list[str] = []
    if failed is not None:
        reasons.append(f"fatal error: {failed}")
    if not serving:
        reasons.append("not serving (starting or stopping)")
    if not store_open:
        reasons.append("store not open")
    reasons += problems
    handler: dict[str, Any] | None = None
    if handler_type is not None:
        linked = local_handler == node_id or peers.get(local_handler or "", False)
        handler = {"type": handler_type, "local": local_handler, "reachable": linked}
        if local_handler is None and not problems:
            reasons.append("LOCAL grouping handler not known yet")
        elif local_handler is not None and not linked:
            reasons.append(f"LOCAL grouping handler {local_handler} not reachable")
    details: dict[str, Any] = {
        "node": node_id,
        "role": role(clustered, handler_type),
        "serving": serving,
        "store_open": store_open,
        "grouping_handler": handler,
        "peers": dict(sorted(peers.items())) if clustered else None,
        "peers_linked": sum(peers.values()),
        "problems": problems,
        "reasons": reasons,
        "resources": dict(resources) if resources is not None else None,
        "ha": dict(ha) if ha is not None else None,
    }
    return Readiness(not reasons, details)
