"""How many connections a gRPC server of this process holds, for `pinmq_connections`.

grpcio tells its servers nothing of their connections; its channelz registry (on by default
in gRPC core) lists every server's listening and open sockets. It is read through grpcio's
Cython layer, the one the `grpcio-channelz` service wraps, only when Prometheus scrapes; where
that layer lacks it the figure is left out rather than guessed.
"""

from __future__ import annotations

import json

from grpc._cython import cygrpc

PAGE = 1000  # sockets asked for per channelz call


def open_connections(port: int) -> int | None:
    """Open connections of the server listening on `port`; None if channelz cannot say."""
    servers_of = getattr(cygrpc, "channelz_get_servers", None)
    sockets_of = getattr(cygrpc, "channelz_get_server_sockets", None)
    if servers_of is None or sockets_of is None:
        return None
    for server in json.loads(servers_of(0)).get("server", []):
        listening = [s.get("name", "") for s in server.get("listenSocket", [])]
        if any(name.endswith(f":{port}") for name in listening):
            return _count(sockets_of, int(server["ref"]["serverId"]))
    return None


def _count(sockets_of: object, server_id: int) -> int:
    count, start = 0, 0
    while True:
        page = json.loads(sockets_of(server_id, start, PAGE))  # type: ignore[operator]
        refs = page.get("socketRef", [])
        count += len(refs)
        if page.get("end", True) or not refs:
            return count
        start = int(refs[-1]["socketId"]) + 1
