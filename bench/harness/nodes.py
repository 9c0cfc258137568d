"""`pinmq node` processes for benchmarks: configs, start-up, cluster formation, queues, probes."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker import channels
from broker.client import Client, PinmqError
from harness import profiling
from harness.procs import reserve_port, spawn, stop, tail
from harness.reach import PLAIN, Reach
from pinmq_pb import client_pb2 as cpb
from pinmq_pb import client_pb2_grpc as cpb_grpc

CLUSTER_NAME = "bench"
START_TIMEOUT_S = 30.0  # a node serving
FORM_TIMEOUT_S = 30.0  # every node sees every other one connected
SETTLE_S = 1.0  # consumer counts reach the other nodes' topology (gossip polls every 0.25 s)
PROBE_TIMEOUT_S = 10.0
ADMIN_TIMEOUT_S = 10.0
LISTENERS = ("client", "stomp", "cluster", "http")


class ClusterNotWorking(RuntimeError):
    """The cluster cannot carry the benchmark (not formed, or grouped sends do not arrive)."""


@dataclass(slots=True)
class NodeProc:
    """One `pinmq node` subprocess."""

    node_id: str
    listen: dict[str, str]  # listen.* addresses
    handler: str | None  # "LOCAL" / "REMOTE" / None
    home: Path  # node.yaml, node.log and the data dir
    proc: Any = None  # subprocess.Popen[bytes] once launched
    reach: Reach = PLAIN  # how clients reach it: TLS, a login
    recorders: list[Any] = field(default_factory=list)  # py-spy on it, once serving (profile.py)

    def client(self) -> Client:
        """A `Client` of the node (not yet connected), with its TLS and login."""
        return self.reach.client(self.url)

    @property
    def log_path(self) -> Path:
        return self.home / "node.log"

    def launch(self) -> None:
        """Start the node process (again: same config, ports and data) without waiting."""
        with self.log_path.open("ab") as log:
            command = ["-m", "pinmq.cli", "node", "--config", str(self.home / "node.yaml")]
            self.proc = spawn([sys.executable, *command], log)

    @property
    def url(self) -> str:
        return self.listen["client"]

    @property
    def cluster(self) -> str | None:
        """listen.cluster when clustered (it hosts the LOCAL grouping handler)."""
        return self.listen["cluster"] if self.handler else None

    @property
    def pid(self) -> int:
        return int(self.proc.pid)


def node_config(
    node_id: str,
    workdir: Path,
    listen: dict[str, str],
    peers: list[str] | None,
    handler: str | None,
    load_balancing: str = "ON_DEMAND",
) -> dict[str, Any]:
    """A node's YAML as a dict; `peers` (other nodes' listen.cluster) makes it clustered."""
    config: dict[str, Any] = {
        "node": {"id": node_id, "data-dir": str(workdir / node_id / "data")},
        "listen": listen,
        "log": {"format": "json", "level": "info"},
    }
    if peers is not None:
        config["cluster"] = {
            "name": CLUSTER_NAME,
            "load-balancing": load_balancing,
            "connectors": peers,
            "reconnect-interval": 200,
        }
    if handler is not None:
        config["grouping-handler"] = {"name": "bench-handler", "type": handler, "timeout": 5000}
    return config


@contextmanager
def running_nodes(
    workdir: Path,
    count: int,
    clustered: bool,
    load_balancing: str = "ON_DEMAND",
    extra: dict[str, Any] | None = None,
    reach: Reach = PLAIN,
) -> Iterator[list[NodeProc]]:
    """`count` node processes serving (node1 LOCAL when clustered); SIGTERM, then kill, on exit.

    `extra`: top-level config sections added to (or replacing those of) every node's YAML;
    `reach`: how clients reach every node (TLS, a login), to match a `tls` or `security` there.
    """
    listens = [{k: f"127.0.0.1:{reserve_port()}" for k in LISTENERS} for _ in range(count)]
    nodes: list[NodeProc] = []
    try:
        for i, listen in enumerate(listens):
            node_id = f"node{i + 1}"
            peers = [x["cluster"] for j, x in enumerate(listens) if j != i] if clustered else None
            handler = ("LOCAL" if i == 0 else "REMOTE") if clustered else None
            home = workdir / node_id
            home.mkdir(parents=True, exist_ok=True)
            config = node_config(node_id, workdir, listen, peers, handler, load_balancing)
            (home / "node.yaml").write_text(yaml.safe_dump({**config, **(extra or {})}))
            node = NodeProc(node_id, listen, handler, home, reach=reach)
            node.launch()
            nodes.append(node)
        for node in nodes:
            wait_serving(node)
        yield nodes
    finally:
        stop(*(node.proc for node in nodes if node.proc is not None))
        for node in nodes:
            profiling.detach(node.recorders)


@contextmanager
def running_node(
    workdir: Path, extra: dict[str, Any] | None = None, reach: Reach = PLAIN
) -> Iterator[NodeProc]:
    """One standalone node: `running_nodes` with a count of one."""
    with running_nodes(workdir, 1, clustered=False, extra=extra, reach=reach) as nodes:
        yield nodes[0]


def wait_serving(node: NodeProc) -> None:
    """Poll the standard gRPC health service (over TLS for a TLS node) until the node
    reports SERVING."""
    deadline = time.monotonic() + START_TIMEOUT_S
    with channels.dial_blocking(node.url, node.reach.tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if node.proc.poll() is not None:
                code = node.proc.returncode
                raise RuntimeError(f"{node.node_id} exited with {code}:\n{tail(node.log_path)}")
            with suppress(grpc.RpcError):
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    # Sampled from here on (bench/profile.py): its work, not its start-up.
                    node.recorders += profiling.attach(node.pid, node.node_id)
                    return
            time.sleep(0.05)
    why = f"{node.node_id} not serving after {START_TIMEOUT_S}s"
    raise RuntimeError(f"{why}:\n{tail(node.log_path)}")


async def wait_formed(nodes: Sequence[NodeProc]) -> str:
    """Wait until every node reports every node connected (Admin.ClusterStatus); a note."""
    ids = {n.node_id for n in nodes}
    deadline = time.monotonic() + FORM_TIMEOUT_S
    last = ""
    for node in nodes:
        async with channels.dial(node.url, [], node.reach.tls) as channel:
            stub = cpb_grpc.AdminStub(channel)
            request, metadata = cpb.ClusterStatusRequest(), node.reach.metadata()
            while True:
                try:
                    reply = await stub.ClusterStatus(request, timeout=2, metadata=metadata)
                except grpc.aio.AioRpcError as err:
                    last = f"{err.code().name}: {err.details()}"
                else:
                    connected = {s.node_id for s in reply.nodes if s.connected}
                    local = [s.node_id for s in reply.nodes if s.handler == "LOCAL"]
                    problems = list(reply.problems)
                    last = f"connected {sorted(connected)}, LOCAL {local}, problems {problems}"
                    if connected >= ids and len(local) == 1 and not problems:
                        break
                if time.monotonic() > deadline:
                    raise ClusterNotWorking(
                        f"the cluster did not form within {FORM_TIMEOUT_S:.0f} s: "
                        f"{node.node_id} reports {last}"
                    )
                await asyncio.sleep(0.1)
    return "every node sees all nodes connected, one LOCAL handler, no problems"


async def admin(coro: Any) -> Any:
    """An admin call with a bound on its time."""
    async with asyncio.timeout(ADMIN_TIMEOUT_S):
        return await coro


async def create_everywhere(nodes: Sequence[NodeProc], queue: str) -> None:
    """The queue on every node (one instance each); an instance already there is fine."""
    for node in nodes:
        async with node.client() as client:
            try:
                await admin(client.create_queue(queue))
            except PinmqError as err:
                if err.code != "ALREADY_EXISTS":
                    raise


async def delete_everywhere(nodes: Sequence[NodeProc], queue: str) -> None:
    for node in nodes:
        with suppress(PinmqError, TimeoutError):
            async with node.client() as client:
                await admin(client.delete_queue(queue))


async def node_queues(node: NodeProc) -> dict[str, tuple[int, int]]:
    """{queue: (depth, consumers)} of a node, from ListQueues."""
    async with node.client() as client:
        listed = await admin(client.queues())
    return {q.name: (q.depth, q.consumer_count) for q in listed}


async def probe_send_path(nodes: Sequence[NodeProc]) -> None:
    """Grouped messages sent through every node but the last reach the last node's consumer.

    Raises ClusterNotWorking naming what did not happen.
    """
    queue = f"probe-{uuid.uuid4().hex[:8]}"
    target = nodes[-1]
    await create_everywhere(nodes, queue)
    try:
        async with target.client() as client:
            consumer = client.consumer(queue, name="probe", prefetch=10)
            await admin(consumer.start())
            await asyncio.sleep(SETTLE_S)
            for via in nodes[:-1]:
                group = f"probe-{via.node_id}"
                async with via.client() as sender:
                    try:
                        await admin(sender.producer(queue, group_id=group).send(b"probe"))
                    except (PinmqError, TimeoutError) as err:
                        raise ClusterNotWorking(
                            f"a grouped send through {via.node_id} ({via.handler}) failed: {err!r}"
                        ) from None
                m = await consumer.receive(PROBE_TIMEOUT_S)
                if m is None or m.group_id != group:
                    depth = {q: d for q, (d, _) in (await node_queues(via)).items()}
                    raise ClusterNotWorking(
                        f"a grouped message sent through {via.node_id} ({via.handler}) did not "
                        f"reach the only consumer, on {target.node_id}, within "
                        f"{PROBE_TIMEOUT_S:.0f} s (got {m and m.group_id!r}; queue depths on "
                        f"{via.node_id}: {depth}): the cluster send path is not working yet"
                    )
                await m.ack(wait=True)
            await consumer.close()
    finally:
        await delete_everywhere(nodes, queue)
