"""`GET /` on listen.http: the web console, one page the node serves with the JSON it reads.

The page (`pinmq/console_page/`: HTML, a script and a style sheet, no build step, nothing
fetched from anywhere but this node) polls the JSON endpoints below and draws the cluster,
this node's queues (rates from two readings of their counters) and the cluster's group map.
The console reads only what the node process hands it (`ConsoleSources`: readiness, the
engine's queries, the cluster admin seam), so it knows nothing of the node's internals; its
routes sit behind HttpServer's guard like every path but the probes.

    GET /api/cluster   readiness, the nodes this node knows (linked or not), the ha pairs
    GET /api/queues    this node's queues with their counts (`QueueCounts`)
    GET /api/groups    ?group=G[&queue=Q]: where G is, cluster-wide, and who did not answer
    GET /api/lagging   the groups with most waiting and the consumers holding most (this node)

Times are wall-clock milliseconds with the node's `now_ms` beside them, so the page shows ages
by the node's clock, not the browser's.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from aiohttp import web

from broker.admin import ClusterAdmin
from broker.clock import now_ns
from broker.engine import Engine
from broker.info import NS_PER_MS, ClusterGroupInfo, GroupInfo
from broker.readiness import Readiness

PAGE = "console_page"  # package data of `pinmq`
ASSETS = {  # path -> (file, content type): all the page loads
    "/": ("index.html", "text/html"),
    "/console/console.js": ("console.js", "text/javascript"),
    "/console/console.css": ("console.css", "text/css"),
    "/console/favicon.svg": ("favicon.svg", "image/svg+xml"),
}
# The page runs only its own script and style, and talks only to this node.
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
LAGGING_LIMIT = 20  # groups, and consumers, /api/lagging lists at most


@dataclass(frozen=True)
class ConsoleSources:
    """What the console reads, handed by the process that runs the HTTP endpoint.

    A passive ha process runs no node: it has neither `engine` nor `admin`, and its readiness
    says which process holds the node. A standalone node has no `admin`.
    """

    node_id: str
    readiness: Callable[[], Readiness]
    engine: Engine | None = None
    admin: ClusterAdmin | None = None


def lagging(engine: Engine, now: int, limit: int = LAGGING_LIMIT) -> dict[str, Any]:
    """This node's most lagging groups, from each queue's bounded top lists (broker/lagging.py:
    no walk of the groups), the deepest first, and its stalled consumers and those that hold
    most unacked messages."""
    queues = engine.queues()
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for q in queues:
        by_backlog, by_age = q.lagging(limit)
        for row in (*by_backlog, *by_age):
            found[(q.name, row.group)] = {
                "queue": q.name,
                "group": row.group,
                "owner_name": row.owner_name,
                "pending": row.backlog,
                "oldest_pending_ms": row.oldest_ns // NS_PER_MS,
                "held": row.held,
            }
    groups = heapq.nsmallest(
        limit,
        found.values(),
        key=lambda r: (-r["pending"], r["oldest_pending_ms"] or now, r["group"]),
    )
    holding = ((q.name, c) for q in queues for c in q.consumers(now) if c.unacked or c.stalled_ms)
    consumers = heapq.nsmallest(
        limit, holding, key=lambda e: (-e[1].stalled_ms, -e[1].unacked, e[1].consumer_id)
    )
    return {
        "taken_ms": now // NS_PER_MS,
        "groups": groups,
        "consumers": [{"queue": name, **asdict(c)} for name, c in consumers],
    }


def _group(g: GroupInfo | ClusterGroupInfo) -> dict[str, Any]:
    """A group-table entry with its times in milliseconds (0: never, none)."""
    row = asdict(g)
    for name in ("last_use", "oldest_pending"):
        row[f"{name}_ms"] = row.pop(f"{name}_ns") // NS_PER_MS
    return row


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(body, sort_keys=True),
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


@dataclass
class Console:
    """The console's routes (`routes`, for HttpServer) over what `sources` reads."""

    sources: ConsoleSources
    _assets: dict[str, tuple[bytes, str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        page = resources.files("pinmq") / PAGE  # read once: a few kB, served from memory
        self._assets = {
            path: ((page / name).read_bytes(), kind) for path, (name, kind) in ASSETS.items()
        }

    def routes(self) -> list[web.RouteDef]:
        return [
            *(web.get(path, self._asset) for path in self._assets),
            web.get("/api/cluster", self._cluster),
            web.get("/api/queues", self._queues),
            web.get("/api/groups", self._groups),
            web.get("/api/lagging", self._lagging_groups),
        ]

    def _answer(self, **body: Any) -> web.Response:
        return _json({"node": self.sources.node_id, "now_ms": now_ns() // NS_PER_MS, **body})

    async def _asset(self, request: web.Request) -> web.Response:
        body, kind = self._assets[request.path]
        headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
        if kind == "text/html":
            headers["Content-Security-Policy"] = POLICY
        return web.Response(body=body, content_type=kind, charset="utf-8", headers=headers)

    async def _cluster(self, _request: web.Request) -> web.Response:
        state = self.sources.readiness()
        admin, engine = self.sources.admin, self.sources.engine
        if admin is not None:
            nodes = [{**asdict(n), "local": n.node_id == admin.node_id} for n in admin.status()]
            pairs, problems = [asdict(p) for p in admin.ha()], admin.problems()
        else:  # standalone, or a passive ha process (no queues)
            queues = engine.queues() if engine is not None else []
            me = {"node_id": self.sources.node_id, "connected": True, "handler": "", "local": True}
            nodes = [{**me, "consumers": {q.name: q.consumer_count for q in queues}}]
            pairs, problems = [], []
        return self._answer(
            ready=state.ready, readiness=state.details, nodes=nodes, ha=pairs, problems=problems
        )

    async def _queues(self, _request: web.Request) -> web.Response:
        engine = self.sources.engine
        queues = engine.queues() if engine is not None else []
        rows = [
            {
                "name": q.name,
                "address": q.address,
                **asdict(q.counts()),
                "enqueued": q.totals.enqueued,
                "settled": q.totals.acked + q.totals.dead_lettered,
            }
            for q in queues
        ]
        return self._answer(queues=sorted(rows, key=lambda r: r["name"]), passive=engine is None)

    async def _groups(self, request: web.Request) -> web.Response:
        """Where a group is: every queue@node that binds or holds it."""
        group = request.query.get("group", "").strip()
        queue = request.query.get("queue", "").strip() or None
        if not group:
            return _json({"error": "group: a group name is required"}, 400)
        admin, engine = self.sources.admin, self.sources.engine
        unreachable: list[str] = []
        if admin is not None:
            found, unreachable = await admin.groups(queue, group)
            rows = [_group(g) for g in found]
        else:
            rows = [
                {"queue": q.name, "node": self.sources.node_id, "bound": None, **_group(g)}
                for q in (engine.queues() if engine is not None else [])
                if queue in (None, q.name)
                for g in q.groups()
                if g.group == group
            ]
        return self._answer(group=group, groups=rows, unreachable=unreachable)

    async def _lagging_groups(self, _request: web.Request) -> web.Response:
        engine = self.sources.engine
        if engine is None:
            return self._answer(groups=[], consumers=[], taken_ms=0)
        return self._answer(**lagging(engine, now_ns()))
