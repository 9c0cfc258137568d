"""Three-node cluster throughput of grouped persistent messages, against one node in the same run.

The script starts a 3-node cluster of real `pinmq node` processes (free loopback ports,
temporary data dirs, cluster + grouping-handler sections, node1 LOCAL, node2/node3 REMOTE),
checks that a grouped message sent through a REMOTE node reaches a consumer on another node
(else it stops with a clear message: the cluster send path is not working), then runs the load:
one producer process per node sending grouped persistent messages (JMSXGroupID, 100 B bodies
carrying producer, sequence and send time) with `send_many`, and one consumer process per
node hosting that node's consumers (prefetch 100, `ack_many`).

Cluster variants (`--variants`, both by default, each on a fresh cluster):
- `on-demand`: `load-balancing: ON_DEMAND`; every producer sends to every group, each starting
  at a different third of the groups. A new group is proposed round robin over the instances
  with consumers, so groups are bound evenly over the nodes and about 2/3 of the messages are
  forwarded by store-and-forward to the node their group is bound to.
- `off`: `load-balancing: OFF`; each producer sends only its own third of the groups, which
  are bound to its own node: nothing is forwarded (the cluster's best case).
Then the same load (3 producer processes, 3 consumer processes, the same consumers) runs
against one standalone node, and the ratio cluster / standalone is printed.

Every run verifies exactly-once (every (producer, seq) delivered once, no redelivery, queues
and store-and-forward queues empty after), per-group order (each producer's messages of a
group arrive in the order sent) and one consumer per group cluster-wide. Every process the
script starts is stopped on exit, error, Ctrl-C or SIGTERM. No timing is asserted.

Usage: python bench/cluster_throughput.py [--quick | --messages N] [--groups G]
       [--variants on-demand off] [--consumers-per-node C] [--non-persistent]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import multiprocessing as mp
import os
import queue as queue_mod
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.client import Client, Consumer, PinmqError, Received
from broker.message import GROUP_ID_HEADER, GROUP_SEQ_HEADER
from pinmq_pb import client_pb2 as cpb
from pinmq_pb import client_pb2_grpc as cpb_grpc

NODES = 3
CLUSTER_NAME = "bench"
CONSUMERS_PER_NODE = 2
PREFETCH = 100
BODY_BYTES = 100  # time_ns (8 B) + producer (2 B) + sequence (4 B) + padding
BATCH_SIZE = 200  # send_many batch size
WINDOW = 16  # send_many batches in flight
POLL_S = 0.05  # how often an idle consumer checks whether the run is over
STALL_S = 30.0  # a run with no ack anywhere for this long has failed
LINGER_S = 0.5  # after the run, how long consumers wait for (unexpected) redeliveries
START_TIMEOUT_S = 30.0  # node processes serving, client processes ready
FORM_TIMEOUT_S = 30.0  # every node sees every other one connected
SETTLE_S = 1.0  # consumer counts reach the other nodes' topology (gossip polls every 0.25 s)
PROBE_TIMEOUT_S = 10.0
ADMIN_TIMEOUT_S = 10.0
RUN_TIMEOUT_S = 600.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAD_KEY_HEADER = "x-bench-tag"  # as long as JMSXGroupID
PAD_SEQ_HEADER = "x-bench-step"  # as long as JMSXGroupSeq


class ClusterNotWorking(RuntimeError):
    """The cluster cannot carry the benchmark (not formed, or grouped sends do not arrive)."""


# ---- process plumbing -------------------------------------------------------------------------


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies (best effort)."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy() -> float:
    """Whole-machine busy CPU seconds so far (user, nice, system, irq, softirq)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = map(int, f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / CLK_TCK


def install_sigterm() -> None:
    """SIGTERM behaves like Ctrl-C, so every `finally` (and context manager) runs."""

    def on_term(_sig: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)


# Sets PR_SET_PDEATHSIG, then execs the node: the setting survives exec, and no preexec_fn
# is needed (with one, Python must fork(), and gRPC's fork handlers complain about our threads).
_DIE_WITH_PARENT_EXEC = (
    "import ctypes, os, sys; ctypes.CDLL(None).prctl(1, 15); os.execv(sys.argv[1], sys.argv[1:])"
)


def start_node(config: Path, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """`pinmq node --config CONFIG`, output to `log`, SIGTERMed by Linux if we die."""
    node = [sys.executable, "-m", "pinmq.cli", "node", "--config", str(config)]
    return subprocess.Popen(
        [sys.executable, "-c", _DIE_WITH_PARENT_EXEC, *node],
        stdout=log,
        stderr=log,
        start_new_session=True,  # Ctrl-C reaches only us; we stop the nodes ourselves
    )


@dataclass(slots=True)
class NodeProc:
    """One `pinmq node` subprocess."""

    node_id: str
    url: str  # listen.client
    cluster: str | None  # listen.cluster when clustered
    handler: str | None  # "LOCAL" / "REMOTE" / None
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 15) -> str:
        with suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


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
    workdir: Path, count: int, clustered: bool, load_balancing: str = "ON_DEMAND"
) -> Iterator[list[NodeProc]]:
    """`count` node processes (node1 LOCAL when clustered); SIGTERM (then kill) all on exit."""
    listens = [
        {k: f"127.0.0.1:{free_port()}" for k in ("client", "stomp", "cluster", "http")}
        for _ in range(count)
    ]
    nodes: list[NodeProc] = []
    try:
        for i, listen in enumerate(listens):
            node_id = f"node{i + 1}"
            peers = [x["cluster"] for j, x in enumerate(listens) if j != i] if clustered else None
            handler = ("LOCAL" if i == 0 else "REMOTE") if clustered else None
            (workdir / node_id).mkdir(parents=True, exist_ok=True)
            path = workdir / node_id / "node.yaml"
            config = node_config(node_id, workdir, listen, peers, handler, load_balancing)
            path.write_text(yaml.safe_dump(config))
            log_path = workdir / node_id / "node.log"
            with log_path.open("ab") as log:
                proc = start_node(path, log)
            cluster = listen["cluster"] if clustered else None
            nodes.append(NodeProc(node_id, listen["client"], cluster, handler, proc, log_path))
        for node in nodes:
            wait_serving(node)
        yield nodes
    finally:
        stop_nodes(nodes)


def stop_nodes(nodes: Sequence[NodeProc]) -> None:
    """SIGTERM every node still running, wait up to 10 s each, then kill."""
    for node in nodes:
        if node.proc.poll() is None:
            with suppress(ProcessLookupError):
                node.proc.send_signal(signal.SIGTERM)
    for node in nodes:
        try:
            node.proc.wait(10)
        except subprocess.TimeoutExpired:
            node.proc.kill()
            node.proc.wait()


def wait_serving(node: NodeProc) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with grpc.insecure_channel(node.url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if node.proc.poll() is not None:
                raise RuntimeError(
                    f"{node.node_id} exited with {node.proc.returncode}:\n{node.log_tail()}"
                )
            with suppress(grpc.RpcError):
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            time.sleep(0.05)
    raise RuntimeError(f"{node.node_id} not serving after {START_TIMEOUT_S}s:\n{node.log_tail()}")


async def wait_formed(nodes: Sequence[NodeProc]) -> str:
    """Wait until every node reports every node connected (Admin.ClusterStatus); a note."""
    ids = {n.node_id for n in nodes}
    deadline = time.monotonic() + FORM_TIMEOUT_S
    last = ""
    for node in nodes:
        async with grpc.aio.insecure_channel(node.url) as channel:
            stub = cpb_grpc.AdminStub(channel)
            while True:
                try:
                    reply = await stub.ClusterStatus(cpb.ClusterStatusRequest(), timeout=2)
                except grpc.aio.AioRpcError as err:
                    if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                        await asyncio.sleep(3 * SETTLE_S)
                        return "ClusterStatus not served yet: waited 3 s for gossip instead"
                    last = f"{err.code().name}: {err.details()}"
                else:
                    connected = {s.node_id for s in reply.nodes if s.connected}
                    local = [s.node_id for s in reply.nodes if s.handler == "LOCAL"]
                    problems = list(reply.problems)
                    last = f"connected {sorted(connected)}, LOCAL {local}, problems {problems}"
                    if connected >= ids and len(local) == 1 and not reply.problems:
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
        async with Client(node.url) as client:
            try:
                await admin(client.create_queue(queue))
            except PinmqError as err:
                if err.code != "ALREADY_EXISTS":
                    raise


async def node_queues(node: NodeProc) -> tuple[dict[str, tuple[int, int]] | None, str]:
    """{queue: (depth, consumers)} of a node from ListQueues, or None and why it failed."""
    async with Client(node.url) as client:
        try:
            listed = await admin(client.queues())
        except PinmqError as err:
            return None, f"ListQueues failed: {err}"
    return {q.name: (q.depth, q.consumer_count) for q in listed}, ""


async def delete_everywhere(nodes: Sequence[NodeProc], queue: str) -> None:
    for node in nodes:
        with suppress(PinmqError, TimeoutError):
            async with Client(node.url) as client:
                await admin(client.delete_queue(queue))


async def probe_send_path(nodes: Sequence[NodeProc]) -> None:
    """Grouped messages sent through node1 (LOCAL) and node2 (REMOTE) reach node3's consumer.

    Raises ClusterNotWorking naming what did not happen.
    """
    queue = f"probe-{uuid.uuid4().hex[:8]}"
    target = nodes[-1]
    await create_everywhere(nodes, queue)
    try:
        async with Client(target.url) as client:
            consumer = client.consumer(queue, name="probe", prefetch=10)
            await admin(consumer.start())
            await asyncio.sleep(SETTLE_S)
            for via in nodes[:-1]:
                group = f"probe-{via.node_id}"
                async with Client(via.url) as sender:
                    try:
                        await admin(sender.producer(queue, group_id=group).send(b"probe"))
                    except (PinmqError, TimeoutError) as err:
                        raise ClusterNotWorking(
                            f"a grouped send through {via.node_id} ({via.handler}) failed: {err!r}"
                        ) from None
                m = await consumer.receive(PROBE_TIMEOUT_S)
                if m is None or m.group_id != group:
                    async with Client(via.url) as sender:
                        depth = {q.name: q.depth for q in await admin(sender.queues())}
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


# ---- load: producers --------------------------------------------------------------------------


def group_name(g: int) -> str:
    return f"g{g:05d}"


def encode(producer: int, seq: int) -> bytes:
    """A body: send time, producer index, sequence number, padding to BODY_BYTES."""
    return (
        time.time_ns().to_bytes(8, "little")
        + producer.to_bytes(2, "little")
        + seq.to_bytes(4, "little")
        + bytes(BODY_BYTES - 14)
    )


def decode(body: bytes) -> tuple[int, int, int]:
    """(send time ns, producer, seq) from a body made by `encode`."""
    return (
        int.from_bytes(body[:8], "little"),
        int.from_bytes(body[8:10], "little"),
        int.from_bytes(body[10:14], "little"),
    )


@dataclass(slots=True, frozen=True)
class Plan:
    """What one producer sends: message i (seq i + 1) goes to groups[(i + offset) % len]."""

    url: str
    node_id: str
    index: int
    count: int
    groups: tuple[str, ...]  # empty: ungrouped
    offset: int = 0
    # Ungrouped messages carry two headers shaped like JMSXGroupID / JMSXGroupSeq, so that a
    # grouped-vs-ungrouped comparison measures routing, not the cost of carrying headers.
    pad: bool = False

    def group_of(self, seq: int) -> str | None:
        if not self.groups:
            return None
        return self.groups[(seq - 1 + self.offset) % len(self.groups)]


def _items(plan: Plan) -> Iterator[tuple[bytes, dict[str, str]]]:
    for seq in range(1, plan.count + 1):
        group = plan.group_of(seq)
        if group:
            headers = {GROUP_ID_HEADER: group, GROUP_SEQ_HEADER: str(seq)}
        elif plan.pad:
            headers = {PAD_KEY_HEADER: group_name(seq % 100), PAD_SEQ_HEADER: str(seq)}
        else:
            headers = {}
        yield encode(plan.index, seq), headers


def producer_main(
    plan: Plan,
    address: str,
    persistent: bool,
    batch_size: int,
    window: int,
    events: Any,
    go: Any,
) -> None:
    """Connect, report ready, wait for `go`, stream the plan's messages; report times and CPU."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us

    async def run() -> None:
        async with Client(plan.url) as client:
            producer = client.producer(address, persistent=persistent)
            events.put(("ready", f"producer {plan.index}"))
            await asyncio.to_thread(go.wait, RUN_TIMEOUT_S)
            cpu0, first = time.process_time(), time.time_ns()
            ids = await producer.send_many(_items(plan), batch_size=batch_size, window=window)
            done = time.time_ns()
            events.put(
                (
                    "producer",
                    {
                        "index": plan.index,
                        "first_ns": first,
                        "done_ns": done,
                        "sent": len(ids),
                        "cpu": time.process_time() - cpu0,
                    },
                )
            )

    asyncio.run(run())


# ---- load: consumers --------------------------------------------------------------------------


@dataclass(slots=True)
class Seen:
    """What one consumer received, in arrival order (parallel lists)."""

    name: str
    node_id: str
    groups: list[str] = field(default_factory=list)
    producers: list[int] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    latency_ns: list[int] = field(default_factory=list)
    redelivered: int = 0
    extra: int = 0  # deliveries that arrived after all were acked
    end_ns: int = 0  # set by the consumer that acked the last message: its receipt time
    node_cpu_end: list[float] = field(default_factory=list)
    machine_end: float = 0.0


async def _consume(
    consumer: Consumer, seen: Seen, total: int, acked: Any, node_pids: list[int]
) -> None:
    """Receive and ack (batched) until `total` messages are acked across all consumers."""
    lock = acked.get_lock()
    progress, stalled_since = 0, time.monotonic()

    def record(batch: list[Received], now: int) -> None:
        for m in batch:
            sent, producer, seq = decode(m.body)
            seen.groups.append(m.group_id or "")
            seen.producers.append(producer)
            seen.seqs.append(seq)
            seen.latency_ns.append(now - sent)
            if m.delivery_count != 1:
                seen.redelivered += 1

    while True:
        m = await consumer.receive(POLL_S)
        if m is None:
            count = acked.value
            if count >= total:
                break
            if count != progress:
                progress, stalled_since = count, time.monotonic()
            elif time.monotonic() - stalled_since > STALL_S:
                return  # the parent reports the stall
            continue
        now = time.time_ns()
        batch = [m]
        while (m := await consumer.receive(0)) is not None:
            batch.append(m)
        record(batch, now)
        with lock:
            before = acked.value
            acked.value = before + len(batch)
        last = before < total <= before + len(batch)
        await consumer.ack_many(batch, wait=last)
        if last:
            seen.end_ns = time.time_ns()
            seen.node_cpu_end = [proc_cpu(p) for p in node_pids]
            seen.machine_end = machine_busy()
            break
    # Anything arriving now would be a redelivery or a duplicate: count it, then stop.
    while (m := await consumer.receive(LINGER_S)) is not None:
        record([m], time.time_ns())
        seen.extra += 1
        await consumer.ack_many([m])


def consumer_main(
    url: str,
    node_id: str,
    queue: str,
    names: list[str],
    prefetch: int,
    total: int,
    acked: Any,
    node_pids: list[int],
    events: Any,
) -> None:
    """Host the consumers `names` on one node (one client): subscribe, report ready, consume."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us

    async def run() -> None:
        async with Client(url) as client:
            consumers = [client.consumer(queue, name=n, prefetch=prefetch) for n in names]
            for c in consumers:
                await c.start()
            cpu0 = time.process_time()
            events.put(("ready", ",".join(names)))
            seen = [Seen(n, node_id) for n in names]
            await asyncio.gather(
                *(
                    _consume(c, s, total, acked, node_pids)
                    for c, s in zip(consumers, seen, strict=True)
                )
            )
            cpu = time.process_time() - cpu0  # includes the linger wait, which is idle
            for c in consumers:
                await c.close()
            events.put(("consumers", {"seen": seen, "cpu": cpu}))

    asyncio.run(run())


# ---- one load run -----------------------------------------------------------------------------


@dataclass(slots=True)
class Host:
    """One consumer process: its node and the consumers it hosts."""

    node: NodeProc
    names: list[str]


@dataclass(slots=True)
class Outcome:
    total: int
    e2e_rate: float
    send_rate: float
    p50_ms: float
    p99_ms: float
    elapsed: float
    node_cpu: dict[str, float]
    client_cpu: float
    machine_busy: float
    forwarded: int  # delivered on another node than the one it was sent to
    per_node: dict[str, tuple[int, int]]  # node -> (groups, messages) delivered there
    checks: dict[str, tuple[bool, str]]

    @property
    def ok(self) -> bool:
        return all(ok for ok, _ in self.checks.values())


async def run_load(
    nodes: Sequence[NodeProc],
    queue: str,
    plans: Sequence[Plan],
    hosts: Sequence[Host],
    persistent: bool,
    args: argparse.Namespace,
    settle_s: float,
) -> Outcome:
    """Consumers subscribe, `settle_s` later the producers start; verify what arrived.

    The queue must exist on every node of `nodes` (and be empty).
    """
    ctx = mp.get_context("spawn")
    total = sum(p.count for p in plans)
    events = ctx.Queue()
    go = ctx.Event()
    acked = ctx.Value("q", 0)
    pids = [n.proc.pid for n in nodes]
    shared = (acked, pids, events)
    consumers = [
        ctx.Process(
            target=consumer_main,
            args=(h.node.url, h.node.node_id, queue, h.names, args.prefetch, total, *shared),
            daemon=True,
        )
        for h in hosts
    ]
    producers = [
        ctx.Process(
            target=producer_main,
            args=(plan, queue, persistent, args.batch, args.window, events, go),
            daemon=True,
        )
        for plan in plans
    ]
    procs = consumers + producers
    results: dict[int, dict[str, Any]] = {}
    seen: list[Seen] = []
    consumer_cpu = 0.0

    async def next_event(timeout: float) -> tuple[str, Any]:
        # Short waits in the thread, so that an interrupt never waits for a long get().
        deadline = time.monotonic() + timeout
        while True:
            with suppress(queue_mod.Empty):
                return await asyncio.to_thread(events.get, True, 0.2)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no word from the client processes in {timeout:.0f} s")
            if any(p.exitcode not in (None, 0) for p in procs):
                raise RuntimeError("a client process failed (see its traceback above)")

    try:
        for p in consumers:
            p.start()
        for _ in consumers:
            kind, _who = await next_event(START_TIMEOUT_S)
            assert kind == "ready", kind
        for node in nodes:
            expected = sum(len(h.names) for h in hosts if h.node is node)
            listed, _why = await node_queues(node)
            got = listed.get(queue, (0, expected))[1] if listed is not None else expected
            if got != expected:
                raise RuntimeError(f"{node.node_id}: {got} consumers on {queue}, not {expected}")
        await asyncio.sleep(settle_s)
        for p in producers:
            p.start()
        for _ in producers:
            kind, _who = await next_event(START_TIMEOUT_S)
            assert kind == "ready", kind
        node_cpu0 = [proc_cpu(p) for p in pids]
        machine0 = machine_busy()
        go.set()
        for _ in procs:
            kind, payload = await next_event(RUN_TIMEOUT_S)
            if kind == "producer":
                results[payload["index"]] = payload
            else:
                seen += payload["seen"]
                consumer_cpu += payload["cpu"]
        for p in procs:
            await asyncio.to_thread(p.join, 10)
        depths: dict[str, int] = {}
        notes: list[str] = []
        for node in nodes:
            listed, why = await node_queues(node)
            if listed is None:
                # Fall back to the group table: pending + outstanding of every group.
                async with Client(node.url) as client:
                    groups = await admin(client.groups(queue))
                depths[f"{queue}@{node.node_id}"] = sum(g.pending + g.outstanding for g in groups)
                notes.append(f"{node.node_id}: {why}")
                continue
            for name, (depth, _consumers) in listed.items():
                if name == queue or name.startswith("$sf."):
                    depths[f"{name}@{node.node_id}"] = depth
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
        events.close()

    enders = [s for s in seen if s.end_ns]
    if not enders:
        got = sum(len(s.seqs) for s in seen)
        raise RuntimeError(f"stalled: {got} of {total} messages delivered, no ack for {STALL_S} s")
    end = enders[0]
    first = min(r["first_ns"] for r in results.values())
    done = max(r["done_ns"] for r in results.values())
    elapsed = (end.end_ns - first) / 1e9
    latencies = sorted(x for s in seen for x in s.latency_ns)
    node_of = {p.index: p.node_id for p in plans}
    forwarded = sum(1 for s in seen for p in s.producers if node_of.get(p, s.node_id) != s.node_id)
    per_node: dict[str, tuple[int, int]] = {}
    for node in nodes:
        mine = [s for s in seen if s.node_id == node.node_id]
        per_node[node.node_id] = (
            len({g for s in mine for g in s.groups if g}),
            sum(len(s.seqs) for s in mine),
        )
    return Outcome(
        total=total,
        e2e_rate=total / elapsed,
        send_rate=total / ((done - first) / 1e9),
        p50_ms=latencies[len(latencies) // 2] / 1e6,
        p99_ms=latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] / 1e6,
        elapsed=elapsed,
        node_cpu={n.node_id: end.node_cpu_end[i] - node_cpu0[i] for i, n in enumerate(nodes)},
        client_cpu=consumer_cpu + sum(r["cpu"] for r in results.values()),
        machine_busy=end.machine_end - machine0,
        forwarded=forwarded,
        per_node=per_node,
        checks=verify(seen, plans, results, depths, notes),
    )


def verify(
    seen: list[Seen],
    plans: Sequence[Plan],
    results: dict[int, dict[str, Any]],
    depths: dict[str, int],
    notes: Sequence[str] = (),
) -> dict[str, tuple[bool, str]]:
    """Exactly-once, per-group order and one consumer per group, with a one-line reason each."""
    total = sum(p.count for p in plans)
    sent = sum(r["sent"] for r in results.values())
    by_index = {p.index: p for p in plans}
    keys = [(p, q) for s in seen for p, q in zip(s.producers, s.seqs, strict=True)]
    expected = {(p.index, q) for p in plans for q in range(1, p.count + 1)}
    wrong_group = sum(
        1
        for s in seen
        for g, p, q in zip(s.groups, s.producers, s.seqs, strict=True)
        if p not in by_index or (by_index[p].group_of(q) or "") != g
    )
    redelivered = sum(s.redelivered for s in seen)
    extra = sum(s.extra for s in seen)
    left = {k: v for k, v in depths.items() if v}
    once = (
        sent == total
        and len(keys) == total
        and set(keys) == expected
        and redelivered == 0
        and extra == 0
        and wrong_group == 0
        and not left
    )
    once_why = (
        f"sent {sent}, delivered {len(keys)}, distinct {len(set(keys))} of {total}, "
        f"redelivered {redelivered}, late extras {extra}, wrong group {wrong_group}, "
        f"left in queues {left or 'none'}"
    )
    if notes:
        once_why += f"; store-and-forward depths unknown ({'; '.join(notes)})"
    disorder = 0
    owners: dict[str, set[str]] = {}
    for s in seen:
        last: dict[tuple[str, int], int] = {}
        for g, p, q in zip(s.groups, s.producers, s.seqs, strict=True):
            if q <= last.get((g, p), 0):
                disorder += 1
            last[(g, p)] = q
            if g:
                owners.setdefault(g, set()).add(f"{s.name}@{s.node_id}")
    shared = sum(1 for o in owners.values() if len(o) > 1)
    grouped = any(p.groups for p in plans)
    per = ", ".join(f"{s.name}@{s.node_id} {len(set(s.groups) - {''})}" for s in seen)
    checks = {
        "exactly-once": (once, once_why),
        "per-group order": (disorder == 0, f"{disorder} out-of-order deliveries"),
    }
    if grouped:
        checks["one consumer per group"] = (
            shared == 0,
            f"{shared} groups at >1 consumer cluster-wide; groups per consumer: {per}",
        )
    return checks


# ---- the benchmark ----------------------------------------------------------------------------


def plans_for(
    nodes: Sequence[NodeProc], n: int, groups: int, own: bool, producers: int = NODES
) -> list[Plan]:
    """`producers` producers, producer k on nodes[k % len(nodes)], n messages in all.

    `own`: producer k sends only groups k, k + producers, ...; else every producer sends to
    every group, producer k starting at group k * groups / producers.
    """
    names = [group_name(g) for g in range(groups)]
    counts = [n // producers + (1 if k < n % producers else 0) for k in range(producers)]
    plans = []
    for k in range(producers):
        node = nodes[k % len(nodes)]
        if own:
            plans.append(Plan(node.url, node.node_id, k, counts[k], tuple(names[k::producers])))
        else:
            offset = k * groups // producers
            plans.append(Plan(node.url, node.node_id, k, counts[k], tuple(names), offset))
    return plans


def hosts_for(nodes: Sequence[NodeProc], per_node: int, processes: int = NODES) -> list[Host]:
    """Consumer processes: one per node, or `processes` spread over the nodes round robin."""
    hosts = [Host(nodes[i % len(nodes)], []) for i in range(max(processes, len(nodes)))]
    total = per_node * len(nodes)
    for c in range(total):
        host = hosts[c % len(hosts)]
        host.names.append(f"c{c + 1}")
    return [h for h in hosts if h.names]


def print_outcome(label: str, o: Outcome) -> None:
    nodes_cpu = sum(o.node_cpu.values())
    print(f"\n== {label} ==")
    print(
        f"  end-to-end              {o.e2e_rate:>8,.0f} msg/s  "
        f"({o.total:,} messages, {o.elapsed:.2f} s first send -> last ack)"
    )
    print(f"  producers send          {o.send_rate:>8,.0f} msg/s")
    print(f"  send -> delivery        p50 {o.p50_ms:.1f} ms, p99 {o.p99_ms:.1f} ms")
    per = ", ".join(f"{k} {v:.2f} s" for k, v in o.node_cpu.items())
    print(
        f"  CPU                     nodes {nodes_cpu:.2f} s ({per}); clients {o.client_cpu:.2f} s; "
        f"machine {o.machine_busy / o.elapsed:.2f} of {os.cpu_count()} cores busy"
    )
    print(f"  node CPU per message    {nodes_cpu / o.total * 1e6:.0f} us")
    spread = ", ".join(f"{k}: {g} groups / {m:,} msgs" for k, (g, m) in o.per_node.items())
    print(f"  delivered per node      {spread}")
    print(f"  forwarded               {o.forwarded:,} ({o.forwarded / o.total:.0%})")
    for name, (ok, why) in o.checks.items():
        print(f"  {name:<24}{'PASS' if ok else 'FAIL'}  ({why})")


async def amain(args: argparse.Namespace) -> bool:
    n = args.messages or (6_000 if args.quick else 30_000)
    mode = "non-persistent" if args.non_persistent else "persistent"
    per_node = args.consumers_per_node
    print(
        f"pinmq cluster throughput: {n:,} {mode} grouped messages per run over {args.groups} "
        f"groups, {BODY_BYTES} B bodies, {NODES} producer processes (send_many {args.batch} x "
        f"window {args.window}), {per_node * NODES} consumers in {NODES} processes "
        f"(prefetch {args.prefetch}, ack_many)"
    )
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    persistent = not args.non_persistent
    ok = True
    best: dict[str, Outcome] = {}

    async def runs(label: str, nodes: list[NodeProc], plans: list[Plan], hosts: list[Host]) -> None:
        nonlocal ok
        settle = SETTLE_S if len(nodes) > 1 else 0.0
        for r in range(1, args.repeat + 1):
            queue = f"tp-{uuid.uuid4().hex[:8]}"
            await create_everywhere(nodes, queue)
            o = await run_load(nodes, queue, plans, hosts, persistent, args, settle)
            await delete_everywhere(nodes, queue)
            ok &= o.ok
            print_outcome(f"{label}" + (f" (run {r}/{args.repeat})" if args.repeat > 1 else ""), o)
            if label not in best or o.e2e_rate > best[label].e2e_rate:
                best[label] = o

    with tempfile.TemporaryDirectory(prefix="pinmq-cluster-") as tmp:
        work = Path(tmp)
        with running_nodes(work / "standalone", 1, clustered=False) as nodes:
            await runs(
                "standalone",
                nodes,
                plans_for(nodes, n, args.groups, own=False),
                hosts_for(nodes, per_node * NODES),
            )
        for variant in args.variants:
            policy = "OFF" if variant == "off" else "ON_DEMAND"
            with running_nodes(
                work / variant, NODES, clustered=True, load_balancing=policy
            ) as nodes:
                print(f"\ncluster ({variant}): {await wait_formed(nodes)}")
                if policy == "ON_DEMAND":
                    await probe_send_path(nodes)
                    print(
                        "send path: grouped messages sent through node1 (LOCAL) and node2 "
                        "(REMOTE) reach a consumer on node3"
                    )
                await runs(
                    f"cluster {variant}",
                    nodes,
                    plans_for(nodes, n, args.groups, own=variant == "off"),
                    hosts_for(nodes, per_node),
                )
    which = f", best of {args.repeat} runs by end-to-end msg/s" if args.repeat > 1 else ""
    print(f"\n== summary{which} ==")
    print(
        f"{'run':<20}{'e2e msg/s':>10}{'send msg/s':>11}{'p50 ms':>8}{'p99 ms':>8}"
        f"{'node CPU/msg':>13}{'fwd':>6}  checks"
    )
    for label, o in best.items():
        print(
            f"{label:<20}{o.e2e_rate:>10,.0f}{o.send_rate:>11,.0f}{o.p50_ms:>8.1f}{o.p99_ms:>8.1f}"
            f"{sum(o.node_cpu.values()) / o.total * 1e6:>10.0f} us{o.forwarded / o.total:>6.0%}"
            f"  {'PASS' if o.ok else 'FAIL'}"
        )
    single = best["standalone"]
    for label, o in best.items():
        if label == "standalone":
            continue
        cpu = sum(o.node_cpu.values()) / max(sum(single.node_cpu.values()), 1e-9)
        print(
            f"ratio {label} / standalone: {o.e2e_rate / single.e2e_rate:.2f} end-to-end "
            f"({o.e2e_rate:,.0f} / {single.e2e_rate:,.0f} msg/s), "
            f"{o.send_rate / single.send_rate:.2f} send; node CPU per message {cpu:.2f}x"
        )
    print(f"load average {os.getloadavg()[0]:.2f} at end; all checks {'PASS' if ok else 'FAIL'}")
    return ok


def add_load_args(parser: argparse.ArgumentParser) -> None:
    """Client knobs shared with bench/cluster_decisions.py."""
    parser.add_argument("--prefetch", type=int, default=PREFETCH, help="consumer prefetch")
    parser.add_argument("--batch", type=int, default=BATCH_SIZE, help="send_many batch size")
    parser.add_argument("--window", type=int, default=WINDOW, help="send_many batches in flight")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="6,000 messages per run")
    size.add_argument("--messages", type=int, metavar="N", help="messages per run (30,000)")
    parser.add_argument("--groups", type=int, default=300, help="groups (300)")
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=("on-demand", "off"),
        default=["on-demand", "off"],
        help="cluster variants to run (both by default; see the module docstring)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per setup; best is kept")
    parser.add_argument("--consumers-per-node", type=int, default=CONSUMERS_PER_NODE, metavar="C")
    parser.add_argument("--non-persistent", action="store_true", help="non-persistent messages")
    add_load_args(parser)
    args = parser.parse_args()
    install_sigterm()
    try:
        ok = asyncio.run(amain(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except ClusterNotWorking as err:
        print(f"cluster not working: {err}", file=sys.stderr)
        sys.exit(2)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
