"""Real `pinmq node` processes forming a cluster on loopback, and helpers to drive them.

Each node has its own client, STOMP and cluster ports (picked once, kept across restarts) and
its own data dir. `ClusterNodes.start` returns once every node is healthy and every running node
sees every other one through gossip (the cluster `Inspect` RPC), so tests never race the links.
Every wait is bounded; none of them asserts on timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from conftest import NodeProcess
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ports import reserve_port
from tcp_proxy import Proxy
from waiting import wait

from broker.client import Client, Consumer, Received
from pinmq.stomp.frames import Frame, FrameParser, encode_frame
from pinmq_pb import cluster_pb2 as cpb
from pinmq_pb import cluster_pb2_grpc as cpb_grpc

WAIT_S = 20.0
NOT_YET = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)  # retried in waits
View = dict[str, dict[str, Any]]  # node id -> {"connected": bool, "instances": {queue: n}}


def grouping(
    node_ids: Iterable[str],
    *,
    timeout: int = 5000,
    group_timeout: int = -1,
    reaper_period: int = 30000,
    rebind_absent_after: int = -1,
    extra: Mapping[str, Any] | None = None,
    **more: Any,
) -> dict[str, dict[str, Any]]:
    """A spec: the first node LOCAL, the others REMOTE, the same grouping settings everywhere
    (`more`: further grouping-handler keys, snake_case for kebab-case)."""
    spec: dict[str, dict[str, Any]] = {}
    for i, node_id in enumerate(node_ids):
        spec[node_id] = {
            "grouping-handler": {
                "type": "LOCAL" if i == 0 else "REMOTE",
                "timeout": timeout,
                "group-timeout": group_timeout,
                "reaper-period": reaper_period,
                "rebind-absent-after": rebind_absent_after,
                **{key.replace("_", "-"): value for key, value in more.items()},
            },
            **(extra or {}),
        }
    return spec


class ClusterNodes:
    """Node processes that list each other as connectors; `spec`: node id -> extra config.

    `separable`: a node whose cluster links all pass through proxies (tests/tcp_proxy.py), so
    `cut_off` can separate it from the others while it and its clients go on. Every node then
    announces its own proxy, so an address learnt by gossip is cut too; the other nodes dial
    each other directly, and those links stay up.
    """

    def __init__(
        self, workdir: Path, spec: Mapping[str, Mapping[str, Any]], separable: str | None = None
    ) -> None:
        self.cluster_addr = {node_id: f"127.0.0.1:{reserve_port()}" for node_id in spec}
        self.proxies = {n: Proxy(a) for n, a in self.cluster_addr.items()} if separable else {}
        self.nodes: dict[str, NodeProcess] = {}
        for node_id, extra in spec.items():
            node_dir = workdir / node_id
            node_dir.mkdir()
            peers = [
                self.proxies[n].address if separable in (n, node_id) else a
                for n, a in self.cluster_addr.items()
                if n != node_id
            ]
            config: dict[str, Any] = {
                "node": {"id": node_id},
                "listen": {"cluster": self.cluster_addr[node_id]},
                "cluster": {"connectors": peers, "reconnect-interval": 100},
            }
            if separable:
                config["cluster"]["advertise"] = self.proxies[node_id].address
            for key, value in extra.items():
                config[key] = {**config.get(key, {}), **value}
            self.nodes[node_id] = NodeProcess(node_dir, config)

    # ---- processes -----------------------------------------------------------------------

    def start(self, *node_ids: str) -> ClusterNodes:
        """Start nodes (default: all), wait until healthy and linked to every running node.

        If they do not come up, the nodes this call started are killed before the error
        propagates: a fixture that never reaches its `yield` leaves nothing running.
        """
        chosen = node_ids or tuple(self.nodes)
        try:
            for node_id in chosen:
                self.nodes[node_id].start(wait=False)
            for node_id in chosen:
                self.nodes[node_id].wait_serving()
            self.wait_linked()
        except BaseException:
            for node_id in chosen:
                self.nodes[node_id].kill()
            raise
        return self

    def stop(self, node_id: str, sig: int = signal.SIGTERM) -> None:
        self.nodes[node_id].stop(sig)

    def kill_all(self) -> None:
        """Kill every node, and close the proxies (the end of a test)."""
        for node in self.nodes.values():
            node.kill()
        for proxy in self.proxies.values():
            proxy.close()

    def cut_off(self, cut: bool = True) -> None:
        """Separate the `separable` node from the others (False: join it again)."""
        for proxy in self.proxies.values():
            if cut:
                proxy.cut()
            else:
                proxy.heal()

    def running(self) -> list[str]:
        return [n for n, p in self.nodes.items() if p.proc is not None and p.proc.poll() is None]

    def url(self, node_id: str) -> str:
        return self.nodes[node_id].url

    def client(self, node_id: str) -> Client:
        node = self.nodes[node_id]
        return Client(node.url, tls=node.tls)

    def stomp_port(self, node_id: str) -> int:
        config = yaml.safe_load(self.nodes[node_id].config_path.read_text())
        return int(config["listen"]["stomp"].rpartition(":")[2])

    def logs(self) -> str:
        return "\n".join(f"==== {n}\n{p.log()[-6000:]}" for n, p in self.nodes.items())

    # ---- what the nodes see --------------------------------------------------------------

    def inspect(self, node_id: str) -> cpb.InspectResponse:
        with self.nodes[node_id].channel(self.cluster_addr[node_id]) as channel:
            return cpb_grpc.ClusterStub(channel).Inspect(cpb.InspectRequest(), timeout=5)

    def view(self, node_id: str) -> View:
        return {
            n.state.node_id: {
                "connected": n.connected,
                "instances": {i.queue: i.consumers for i in n.state.instances},
            }
            for n in self.inspect(node_id).nodes
        }

    def health(self, node_id: str, service: str) -> int:
        with self.nodes[node_id].channel(self.url(node_id)) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=5
            )
            return reply.status

    def wait(self, what: str, check: Callable[[], bool]) -> None:
        """`wait` for `check`; a node not answering yet means "not yet", not failure, and a
        timeout shows the nodes' logs."""

        def answered() -> bool:
            try:
                return check()
            except grpc.RpcError as err:
                if err.code() not in NOT_YET:
                    raise
                return False

        try:
            wait(what, answered)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{self.logs()}") from None

    def wait_linked(self) -> None:
        """Every running node sees every other running node connected."""
        running = self.running()

        def linked() -> bool:
            for node_id in running:
                view = self.view(node_id)
                if not all(view.get(n, {}).get("connected") for n in running):
                    return False
            return True

        self.wait(f"gossip between {running}", linked)

    def wait_consumers(self, queue: str, counts: Mapping[str, int]) -> None:
        """Every running node sees `queue@node` with these consumer counts (so routes use them)."""

        def seen() -> bool:
            for observer in self.running():
                view = self.view(observer)
                for node_id, n in counts.items():
                    if view.get(node_id, {}).get("instances", {}).get(queue) != n:
                        return False
            return True

        self.wait(f"consumers {dict(counts)} of {queue} to be seen everywhere", seen)


# ---- consuming ----------------------------------------------------------------------------------


@dataclass
class Collector:
    """Consumers of one queue on several nodes, receiving and acking in the background.

    `got` lists (consumer label, message) in the order each consumer received them.
    """

    got: list[tuple[str, Received]] = field(default_factory=list)
    _consumers: list[Consumer] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def add(self, client: Client, queue: str, label: str, prefetch: int = 100) -> None:
        consumer = client.consumer(queue, name=label, prefetch=prefetch)
        await consumer.start()
        self._consumers.append(consumer)
        self._tasks.append(asyncio.create_task(self._run(consumer, label)))

    async def _run(self, consumer: Consumer, label: str) -> None:
        while (m := await consumer.receive()) is not None:
            self.got.append((label, m))
            self._arrived.set()
            await m.ack()

    async def wait(self, n: int, what: str = "") -> None:
        """Until `n` messages arrived in all (bounded)."""
        deadline = time.monotonic() + WAIT_S
        while len(self.got) < n:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"only {len(self.got)} of {n} messages arrived {what}"
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for consumer in self._consumers:
            await consumer.close()
        self._tasks, self._consumers = [], []

    def bodies(self) -> list[str]:
        return [m.body.decode() for _, m in self.got]

    def per_group(self) -> dict[str | None, list[tuple[str, str]]]:
        """group -> [(consumer label, body)] in arrival order."""
        out: dict[str | None, list[tuple[str, str]]] = {}
        for label, m in self.got:
            out.setdefault(m.group_id, []).append((label, m.body.decode()))
        return out

    def owners(self) -> dict[str | None, set[str]]:
        return {g: {label for label, _ in entries} for g, entries in self.per_group().items()}


class Consuming:
    """The collectors and clients a test opens, closed when it ends however it ends."""

    def __init__(self) -> None:
        self.collectors: list[Collector] = []
        self.clients: list[Client] = []

    def collector(self) -> Collector:
        collector = Collector()
        self.collectors.append(collector)
        return collector

    async def close(self) -> None:
        for collector in self.collectors:
            await collector.close()
        for client in self.clients:
            await client.close()


@pytest.fixture
async def consuming() -> AsyncIterator[Consuming]:
    """`Consuming` for the test: its collectors and clients closed after it."""
    scaffold = Consuming()
    try:
        yield scaffold
    finally:
        await scaffold.close()


# ---- STOMP ------------------------------------------------------------------------------------


async def stomp_send(
    port: int, destination: str, messages: list[tuple[str, dict[str, str]]]
) -> list[Frame]:
    """Send persistent SENDs on one connection, a receipt on the last; the frames that come back.

    Returns at the RECEIPT, or at the ERROR frame (the node then closes the connection).
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    parser = FrameParser(escaping=True)
    writer.write(encode_frame("CONNECT", {"accept-version": "1.2", "host": "localhost"}))
    for i, (body, headers) in enumerate(messages):
        extra = {"receipt": "last"} if i == len(messages) - 1 else {}
        frame_headers = {"destination": f"/queue/{destination}", "persistent": "true"}
        writer.write(encode_frame("SEND", {**frame_headers, **headers, **extra}, body.encode()))
    await writer.drain()
    frames: list[Frame] = []
    try:
        async with asyncio.timeout(WAIT_S):
            while True:
                while (frame := parser.next()) is not None:
                    frames.append(frame)
                    if frame.command in ("RECEIPT", "ERROR"):
                        return frames
                data = await reader.read(65536)
                assert data, f"connection closed; frames so far: {frames}"
                parser.feed(data)
    finally:
        writer.close()


# ---- scenarios' building blocks -----------------------------------------------------------

NODES = ("n1", "n2", "n3")


async def create_everywhere(nodes: ClusterNodes, queue: str, node_ids=NODES) -> None:
    for node_id in node_ids:
        async with nodes.client(node_id) as client:
            await client.create_queue(queue)


async def consumers_on(
    nodes: ClusterNodes, queue: str, node_ids, collector: Collector, clients: list[Client]
) -> None:
    """One consumer per node (labelled with the node id), seen by every node before returning."""
    for node_id in node_ids:
        client = nodes.client(node_id)
        await client.connect()
        clients.append(client)
        await collector.add(client, queue, node_id)
    nodes.wait_consumers(queue, {n: 1 for n in node_ids})


def in_order(collector: Collector, expected: dict[str, list[str]]) -> dict[str, str]:
    """Each group went whole to one consumer, in order, and nothing else arrived; group -> node."""
    per_group = collector.per_group()
    assert set(per_group) == set(expected), f"groups seen {set(per_group)}"
    owner: dict[str, str] = {}
    for group, bodies in expected.items():
        got = per_group[group]
        labels = {label for label, _ in got}
        assert len(labels) == 1, f"group {group} went to several consumers: {labels}"
        assert [b for _, b in got] == bodies, f"group {group} out of order or incomplete"
        owner[group] = labels.pop()
    return owner
