"""Shared fixtures: real `pinmq node` processes on reserved loopback ports with temporary data dirs.

Every process a test starts is stopped whatever fails: a node that does not come up is killed
before the error propagates, and at the end of the session any process still running with this
session's temporary directory on its command line is killed and reported as an error.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ports import reserve_port
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from waiting import wait

from broker import channels
from broker.tls import TlsFiles

if TYPE_CHECKING:
    from broker.client import Client, Received

START_TIMEOUT_S = 20.0
TESTS = Path(__file__).resolve().parent  # the test helpers; the tests are in folders by layer
REPO = TESTS.parent
pytest_plugins = [  # fixtures
    "stomp_helpers", "store_harness", "cluster_nodes", "spark_session", "browser",
]  # fmt: skip

# `make test` runs tests on several pytest-xdist workers, each test on its own, except the
# modules named here: the tests of a group run on one worker, one after another, and groups are
# handed out first, the biggest first.
XDIST_GROUPS = {
    # Failover drills, in processes and in containers, one at a time: each fails an ha pair
    # against a 1 s failure-timeout, and two at once (four loaded processes or containers
    # each, then a Spark check) would leave the outcome to the scheduler of two cores;
    # test_compose's image is a module fixture too.
    "test_ha.py": "failover drills",
    "test_compose.py": "failover drills",
    # The chaos run beside them, on a worker of its own: faults are what it is made of, and
    # in the failover drills' line it made that line alone take 22 minutes.
    "test_chaos.py": "chaos run",
    # The console's browser test kills the pair's primary too, with a Chromium on top: not
    # beside a drill.
    "test_console.py": "failover drills",
    # Cluster drills one at a time: each loads three nodes and ends with a Spark check.
    "test_drills.py": "cluster drills",
    # A module fixture (a node, a cluster, a run of the README tours) serves the module's tests:
    # on one worker it starts once.
    **{
        name: name
        for name in (
            "test_audit_cluster.py",
            "test_cluster.py",
            "test_input_validation.py",
            "test_readme_tours.py",
            "test_stomp.py",
            "test_stomp_errors.py",
            "test_stomp_groups.py",
        )
    },
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` by XDIST_GROUPS. xdist's own loadgroup reads `xdist_group` marks by
    appending the group to each test's id, which pytest 9.2 no longer lets it do: the marks
    are silently ignored (pytest-xdist#1386). The scheduler needs only the ids."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0].rpartition("/")[2]
            return XDIST_GROUPS.get(module, nodeid)

    return ModuleGroups(config, log)


def unique(prefix: str = "q") -> str:
    """A queue/address/group name no other test uses (tests share one node)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def create_on(queue: str, *nodes: NodeProcess) -> None:
    """`queue` created on each of `nodes` (standalone nodes share nothing)."""
    from broker.client import Client  # the client only where a test uses one

    for node in nodes:
        async with Client(node.url) as client:
            await client.create_queue(queue)


async def depth(client: Client, queue: str) -> int:
    """Messages `queue` holds at the client's node, delivered or not, not yet acknowledged."""
    return next(q.depth for q in await client.queues() if q.name == queue)


async def drain(client: Client, queue: str, guard_s: float = 30.0) -> list[Received]:
    """Every message `queue` holds at the client's node, received and acked, in the order
    received. Nothing more comes: the node sends deliveries before the receipt of the acks
    that follow them, and then holds none (a wait could only prove that nothing came soon)."""
    count = await depth(client, queue)
    got: list[Received] = []
    async with client.consumer(queue, prefetch=1000) as consumer:
        while len(got) < count:
            m = await consumer.receive(timeout=guard_s)
            assert m is not None, f"only {len(got)} of the {count} messages of {queue} came"
            got.append(m)
        await consumer.ack_many(got, wait=True)
        assert await consumer.receive(0) is None, f"more than the {count} messages came"
    assert await depth(client, queue) == 0
    return got


def get(address: str, path: str, tls: TlsFiles | None = None) -> tuple[int, dict[str, Any]]:
    """GET http://address/path (https, trusting `tls.ca`, with `tls`) -> (status, JSON body),
    whatever the status."""
    scheme, context = ("https", tls.client_context()) if tls is not None else ("http", None)
    try:
        with urllib.request.urlopen(
            f"{scheme}://{address}{path}", timeout=5, context=context
        ) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


@dataclass(frozen=True)
class Scrape:
    """A node's `GET /metrics`, as prometheus-client's own parser reads it."""

    samples: list[Sample]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        return cls([s for family in text_string_to_metric_families(text) for s in family.samples])

    def value(self, name: str, **labels: str) -> float:
        """The value of the one sample of `name` whose labels include `labels`."""
        found = [s for s in self.samples if s.name == name and labels.items() <= s.labels.items()]
        assert len(found) == 1, f"{len(found)} samples of {name} {labels}: {found}"
        return found[0].value

    def labels(self, name: str) -> list[dict[str, str]]:
        """The label sets of every sample of `name` (none: the node reports no such thing)."""
        return [s.labels for s in self.samples if s.name == name]


def scrape(address: str) -> Scrape:
    """GET http://address/metrics (no security), parsed; it must be Prometheus' text format."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
        assert reply.headers.get_content_type() == "text/plain"
        return Scrape.parse(reply.read().decode())


def node_command(config: Path) -> list[str]:
    return [*PINMQ, "node", "--config", str(config)]


PINMQ = [sys.executable, "-m", "pinmq.cli"]  # the `pinmq` command of this checkout


def cli(*args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `pinmq ARGS...` as a subprocess and capture its output."""
    return subprocess.run(
        [*PINMQ, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class NodeProcess:
    """A node process started from a YAML config; restartable on the same data dir."""

    def __init__(self, workdir: Path, extra: dict[str, Any] | None = None) -> None:
        self.port = reserve_port()
        self.url = f"127.0.0.1:{self.port}"
        self.data_dir = workdir / "data"
        self.config_path = workdir / "node.yaml"
        self.log_path = workdir / "node.log"
        config: dict[str, Any] = {
            "node": {"id": f"test-{self.port}", "data-dir": str(self.data_dir)},
            "listen": {
                "client": self.url,
                "stomp": f"127.0.0.1:{reserve_port()}",
                "http": f"127.0.0.1:{reserve_port()}",
            },
            "log": {"format": "json", "level": "info"},
        }
        for key, value in (extra or {}).items():
            config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
        self.http = config["listen"]["http"]  # host:port of GET /healthz and /readyz
        # With `tls`: the node's own files, which the tests' channels present and trust.
        tls = config.get("tls")
        self.tls = TlsFiles(Path(tls["ca"]), Path(tls["cert"]), Path(tls["key"])) if tls else None
        self.stomp_port = int(config["listen"]["stomp"].rpartition(":")[2])
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def store_path(self) -> Path:
        return self.data_dir / "store.db"

    def start(self, wait: bool = True) -> NodeProcess:
        """Start the node (and wait until it serves); a node that does not come up is killed."""
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(node_command(self.config_path), stdout=log, stderr=log)
        log.close()
        if wait:
            try:
                self.wait_serving()
            except BaseException:
                self.kill()
                raise
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_serving(self) -> None:
        """Poll the standard gRPC health service until the node reports SERVING."""
        proc = self.proc
        assert proc is not None
        with self.channel(self.url) as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            def serving() -> bool:
                if proc.poll() is not None:
                    raise RuntimeError(f"node exited with {proc.returncode}:\n{self.log()}")
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                return reply.status == health_pb2.HealthCheckResponse.SERVING

            try:
                wait("the node serving", serving, START_TIMEOUT_S, ignoring=(grpc.RpcError,))
            except AssertionError:
                raise RuntimeError(
                    f"node not serving after {START_TIMEOUT_S}s:\n{self.log()}"
                ) from None

    def channel(self, address: str) -> grpc.Channel:
        """A blocking channel to one of the node's gRPC listeners, over TLS if it has tls."""
        return channels.dial_blocking(address, self.tls)

    def wait_exit(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Signal the node and wait for it; returns its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        if code != 0 and sig in (signal.SIGTERM, signal.SIGINT):  # a clean stop failed: why
            print(
                f"node {self.port} exited {code}; its last log lines:",
                *self.log().splitlines()[-40:],
                sep="\n",
            )
        return code

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The node stopped (SIGSTOP) inside the block: sockets open, nothing answered, nothing
        noticed; it carries on (SIGCONT) when the block ends, whatever happened."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _ancestors() -> set[int]:
    """This process and the ones that started it (their command lines may name the temp dir)."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state: ppid
    return pids


def _processes_under(path: Path) -> dict[int, str]:
    """pid -> command line of every process whose command line names something under `path`."""
    found: dict[int, str] = {}
    mine, inside = _ancestors(), f"{path}{os.sep}"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # it ended meanwhile
        if inside in cmdline:
            found[int(entry.name)] = cmdline.strip()
    return found


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Fail the session if any process started under its temporary directory outlives it."""
    base = tmp_path_factory.getbasetemp()
    yield
    left = _processes_under(base)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, "processes left running by the tests (now killed):\n" + "\n".join(
        f"  {pid}: {cmd}" for pid, cmd in sorted(left.items())
    )


@pytest.fixture
def node_factory(tmp_path: Path) -> Iterator[Callable[..., NodeProcess]]:
    """Start nodes with config overrides, e.g. `node_factory({"limits": {...}})`."""
    nodes: list[NodeProcess] = []

    def make(extra: dict[str, Any] | None = None, start: bool = True) -> NodeProcess:
        workdir = tmp_path / f"node{len(nodes)}"
        workdir.mkdir()
        node = NodeProcess(workdir, extra)
        nodes.append(node)
        return node.start() if start else node

    yield make
    for node in nodes:
        node.kill()


@pytest.fixture(scope="session")
def shared_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One node for the tests that only need isolation by queue name."""
    node = NodeProcess(tmp_path_factory.mktemp("shared-node")).start()
    yield node
    node.kill()


@pytest.fixture
def url(shared_node: NodeProcess) -> str:
    return shared_node.url
