"""A node as a pair of real processes, with the two other nodes, which vote: the HA drills'
cluster. node1 (ha primary) and node1-backup (or node2 and node2-backup) list the other two
nodes as connectors; those list each other and both processes of the pair. Every wait is
bounded and none asserts on timing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from conftest import NodeProcess, get
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ports import reserve_port
from tcp_proxy import Proxy
from waiting import wait

from pinmq_pb import client_pb2, client_pb2_grpc

PRIMARY, BACKUP = "node1", "node1-backup"
WAIT_S = 30.0


def serving(node: NodeProcess) -> bool:
    """Its client listener answers SERVING (a passive pair process keeps it closed)."""
    with grpc.insecure_channel(node.url) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=0.5
            )
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def ready(node: NodeProcess) -> bool:
    """GET /readyz answers 200: serving, and its grouping handler runs (a node's client port
    opens a moment before its handler takes decisions)."""
    try:
        status, _ = get(node.http, "/readyz")
    except OSError:
        return False
    return status == 200


def pair_as_heard(node: NodeProcess) -> tuple[str, str, bool] | None:
    """(active, backup, backup in sync) of the pair as a node last heard it from the active's
    heartbeats (its voter's record; `pinmq status`), None if it does not answer or heard none."""
    with grpc.insecure_channel(node.url) as channel:
        try:
            reply = client_pb2_grpc.AdminStub(channel).ClusterStatus(
                client_pb2.ClusterStatusRequest(), timeout=1.0
            )
        except grpc.RpcError:
            return None
    return next(((p.active, p.backup, p.backup_in_sync) for p in reply.ha), None)


def ha_detail(node: NodeProcess, key: str) -> Any:
    """A key of the `ha` part of its /readyz, None if it does not answer."""
    try:
        _, body = get(node.http, "/readyz")
    except OSError:
        return None
    return (body.get("ha") or {}).get(key)


class HaCluster:
    """`extra`: more top-level config sections for every process (e.g. `audit`). With
    `proxied`, everything between the pair's two processes goes through test proxies
    (`cut_pair`), while both still reach the other nodes directly. `paired`: the node that
    runs as a pair, node1 (LOCAL, by default) or a REMOTE one, node2; node1 is LOCAL either
    way, and the two nodes that are not paired (`others`) vote between the pair's processes."""

    def __init__(
        self,
        workdir: Path,
        ha: dict[str, Any] | None = None,
        proxied: bool = False,
        extra: dict[str, Any] | None = None,
        paired: str = PRIMARY,
    ) -> None:
        self.primary_name, self.backup_name = primary, backup = paired, f"{paired}-backup"
        self.others = tuple(n for n in (PRIMARY, "node2", "node3") if n != paired)
        names = (primary, backup, *self.others)
        self.cluster = {n: f"127.0.0.1:{reserve_port()}" for n in names}
        c = self.cluster
        self.proxies = [Proxy(c[primary]), Proxy(c[backup])] if proxied else []
        to_primary = self.proxies[0].address if proxied else c[primary]
        backup_ha = {"role": "backup", "primary": to_primary, **(ha or {})}
        if proxied:
            backup_ha["advertise"] = self.proxies[1].address
        first, second = self.others
        connectors = {
            primary: [c[first], c[second]],
            backup: [c[first], c[second]],
            first: [c[primary], c[backup], c[second]],
            second: [c[primary], c[backup], c[first]],
        }
        self.nodes: dict[str, NodeProcess] = {}
        for name in names:
            node_dir = workdir / name
            node_dir.mkdir()
            logical = paired if name == backup else name
            config: dict[str, Any] = {
                "node": {"id": name},
                "listen": {"cluster": c[name]},
                "cluster": {"connectors": connectors[name], "reconnect-interval": 100},
                "grouping-handler": {"type": "LOCAL" if logical == PRIMARY else "REMOTE"},
            }
            config.update(extra or {})
            if name == primary:
                config["ha"] = {"role": "primary", **(ha or {})}
            elif name == backup:
                config["ha"] = backup_ha
            self.nodes[name] = NodeProcess(node_dir, config)

    @property
    def primary(self) -> NodeProcess:
        return self.nodes[self.primary_name]

    @property
    def backup(self) -> NodeProcess:
        return self.nodes[self.backup_name]

    @property
    def pair_url(self) -> str:
        return f"{self.primary.url},{self.backup.url}"

    @property
    def stomp_pair(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", self.primary.stomp_port), ("127.0.0.1", self.backup.stomp_port)]

    def client_url(self, name: str) -> str:
        return self.nodes[name].url

    def stop_audited(self) -> dict[str, Path]:
        """Stop every running process cleanly; each one's audit directory."""
        for node in self.nodes.values():
            if node.proc is not None and node.proc.poll() is None:
                node.stop()
        return {name: node.data_dir / "audit" for name, node in self.nodes.items()}

    def start(self) -> HaCluster:
        """All four; returns once node1 serves with its backup in sync."""
        try:
            for node in self.nodes.values():
                node.start(wait=False)
            for name in self.others:
                self.nodes[name].wait_serving()
            wait(f"{self.primary_name} serves", lambda: serving(self.primary))
            self.wait_in_sync(self.primary)
        except BaseException:
            self.kill_all()
            raise
        return self

    def wait_in_sync(self, active: NodeProcess) -> None:
        wait("every process knows the backup is in sync", lambda: self.in_sync(active))

    def in_sync(self, active: NodeProcess) -> bool:
        """Every process knows that `active`'s backup holds everything: the active, its
        backup (a passive out of sync never stands) and both voters, whose votes a takeover
        needs (they elect no backup the active did not announce in sync). Only then may a
        test count on a failover to the backup: the active's own view comes first, and the
        others hear it with its next heartbeat."""
        [(name, _)] = [(n, p) for n, p in self.nodes.items() if p is active]
        backup = self.backup_name if name == self.primary_name else self.primary_name
        return bool(
            ha_detail(active, "backup_in_sync")
            and ha_detail(self.nodes[backup], "in_sync")
            and all(
                pair_as_heard(self.nodes[voter]) == (name, backup, True) for voter in self.others
            )
        )

    def cut_pair(self) -> None:
        for proxy in self.proxies:
            proxy.cut()

    def heal_pair(self) -> None:
        for proxy in self.proxies:
            proxy.heal()

    def kill_all(self) -> None:
        for node in self.nodes.values():
            node.kill()
        for proxy in self.proxies:
            proxy.close()
