"""TLS on every listener, against real node processes: real handshakes with the Python client,
stomp.py, urllib and raw sockets; mutual TLS between the nodes of a cluster.

Certificates come from `pinmq certs` (pinmq/certs.py): the cluster's CA, and a rogue CA that
issued a certificate under a node's own name.
"""

from __future__ import annotations

import datetime
import http.client
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import stomp
from cluster_nodes import ClusterNodes, grouping
from conftest import NodeProcess, cli, get, node_command

from broker.client import Client, ConnectionLost, TlsFiles, Unauthenticated
from broker.users import UserEntry, hash_password, write_users
from pinmq import certs as certs_module
from pinmq.certs import write_certs
from pinmq_pb import cluster_pb2 as cpb
from pinmq_pb import cluster_pb2_grpc as cpb_grpc
from pinmq_pb import grouping_pb2 as gpb
from pinmq_pb import grouping_pb2_grpc as gpb_grpc

NODES = ("n1", "n2", "n3")
WAIT_S = 15.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tls") / "certs"
    write_certs(directory, NODES, clients=["alice", "mallory"])
    return directory


@pytest.fixture(scope="module")
def rogue(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another CA, with a certificate for n2: right name, wrong issuer."""
    directory = tmp_path_factory.mktemp("rogue") / "certs"
    write_certs(directory, ["n2"])
    return directory


def tls_section(certs: Path, node: str, client_auth: str = "none") -> dict[str, Any]:
    return {
        "cert": str(certs / f"{node}.crt"),
        "key": str(certs / f"{node}.key"),
        "ca": str(certs / "ca.crt"),
        "client-auth": client_auth,
    }


def trusting(certs: Path, user: str | None = None) -> TlsFiles:
    """What a client holds: the CA, and a user's certificate if given."""
    if user is None:
        return TlsFiles(certs / "ca.crt")
    return TlsFiles(certs / "ca.crt", certs / f"{user}.crt", certs / f"{user}.key")


def start_node(tmp: Path, certs: Path, client_auth: str = "none") -> NodeProcess:
    extra = {"node": {"id": "n1"}, "tls": tls_section(certs, "n1", client_auth)}
    return NodeProcess(tmp, extra).start()


@pytest.fixture
def node(tmp_path: Path, certs: Path) -> Iterator[NodeProcess]:
    started = start_node(tmp_path, certs)
    yield started
    started.kill()


async def round_trip(url: str, tls: TlsFiles | None, queue: str, count: int = 3) -> list[str]:
    """Send `count` messages of one group and consume them: the bodies, in arrival order."""
    async with Client(url, tls=tls, connect_timeout=2.0, failover_timeout=0) as client:
        producer = client.producer(queue, group_id="g")
        for i in range(count):
            await producer.send(f"m{i}")
        async with client.consumer(queue, prefetch=count) as consumer:
            got = [await consumer.receive(WAIT_S) for _ in range(count)]
            await consumer.ack_many([m for m in got if m is not None], wait=True)
    return [m.body.decode() for m in got if m is not None]


def stomp_round_trip(port: int, tls: TlsFiles, queue: str) -> list[str]:
    """SEND one message and receive it back over stomp.py with TLS."""
    conn = stomp.Connection12([("localhost", port)], heartbeats=(0, 0))
    conn.set_ssl(
        for_hosts=[("localhost", port)],
        ca_certs=str(tls.ca),
        cert_file=str(tls.cert) if tls.cert else None,
        key_file=str(tls.key) if tls.key else None,
    )
    received: list[str] = []
    arrived = threading.Event()

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame: Any) -> None:
            received.append(frame.body)
            arrived.set()

    conn.set_listener("l", Listener())
    conn.connect(wait=True)
    try:
        conn.subscribe(f"/queue/{queue}", id="1", ack="auto")
        conn.send(f"/queue/{queue}", "over tls", headers={"persistent": "true"})
        arrived.wait(WAIT_S)
    finally:
        conn.disconnect()
    return received


def stomp_refused(port: int, tls: TlsFiles) -> bool:
    """Whether a STOMP CONNECT over TLS with these files gets no CONNECTED frame back: the
    handshake fails or the node closes the connection (under TLS 1.3 a client certificate is
    refused after the client's side of the handshake is done). stomp.py is not used here: on
    such a refusal it may retry without end."""
    context = tls.client_context()
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as sock,
        ):
            sock.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
            return not sock.recv(4096).startswith(b"CONNECTED")
    except TimeoutError:
        return False  # no answer at all is not a refusal
    except (ssl.SSLError, OSError):
        return True


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def listeners(node: NodeProcess) -> dict[str, int]:
    return {"client": node.port, "stomp": node.stomp_port, "http": port_of(node.http)}


def client_hello() -> bytes:
    """The first bytes a TLS client sends: a real ClientHello."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def answer_to(port: int, data: bytes) -> bytes:
    """Send `data` on a plain socket and read what comes back until the node closes or stops
    answering."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        try:
            while chunk := sock.recv(4096):
                got += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return got


# ---- one node -------------------------------------------------------------------------------


async def test_the_client_listener_speaks_tls_only(
    node: NodeProcess, certs: Path, rogue: Path
) -> None:
    assert await round_trip(node.url, trusting(certs), "tls-q") == ["m0", "m1", "m2"]
    with pytest.raises(ConnectionLost):  # plain text against a TLS listener
        await round_trip(node.url, None, "plain-q")
    with pytest.raises(ConnectionLost):  # a client that trusts another CA
        await round_trip(node.url, trusting(rogue), "q")


def test_stomp_and_http_speak_tls_only(node: NodeProcess, certs: Path) -> None:
    assert stomp_round_trip(node.stomp_port, trusting(certs), "stomp-tls") == ["over tls"]
    connect = b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00"
    assert b"CONNECTED" not in answer_to(node.stomp_port, connect)

    status, body = get(node.http, "/healthz", trusting(certs))
    assert (status, body["alive"]) == (200, True)
    with pytest.raises((OSError, http.client.HTTPException)):
        get(node.http, "/healthz")  # plain HTTP


def test_the_cli_and_the_probe_speak_tls(node: NodeProcess, certs: Path) -> None:
    ca = str(certs / "ca.crt")
    listed = cli("queues", "--url", node.url, "--tls-ca", ca)
    assert listed.returncode == 0, listed.stderr
    alone = cli("queues", "--url", node.url, "--tls-cert", str(certs / "alice.crt"))
    assert alone.returncode == 2 and "need --tls-ca" in alone.stderr
    missing = cli("queues", "--url", node.url, "--tls-ca", str(certs / "missing.crt"))
    assert (
        missing.returncode == 2 and "--tls-ca" in missing.stderr and "cannot read" in missing.stderr
    )
    probe = [sys.executable, "-m", "pinmq.probe", node.http]
    healthy = subprocess.run([*probe, ca], capture_output=True, text=True, timeout=30)
    assert (healthy.returncode, healthy.stdout.split(":")[0]) == (0, "healthy")
    plain = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    assert plain.returncode == 1


@pytest.mark.parametrize(
    "bad",
    ["garbage", "truncated handshake", "plain text"],
)
async def test_bad_tls_input_leaves_the_node_serving_others(
    node: NodeProcess, certs: Path, bad: str
) -> None:
    data = {
        "garbage": bytes(range(256)) * 4,
        "truncated handshake": client_hello()[:40],
        "plain text": b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    }[bad]
    for port in listeners(node).values():
        for _ in range(3):
            answer_to(port, data)
    # Every listener still serves a well-behaved client.
    assert await round_trip(node.url, trusting(certs), f"after-{bad[:4]}") == ["m0", "m1", "m2"]
    assert stomp_round_trip(node.stomp_port, trusting(certs), f"s-{bad[:4]}") == ["over tls"]
    assert get(node.http, "/healthz", trusting(certs))[0] == 200
    assert node.proc is not None and node.proc.poll() is None


async def test_client_auth_required_wants_a_certificate_of_the_ca(
    tmp_path: Path, certs: Path, rogue: Path
) -> None:
    node = start_node(tmp_path, certs, client_auth="required")
    try:
        assert await round_trip(node.url, trusting(certs, "alice"), "cert-q") == ["m0", "m1", "m2"]
        with pytest.raises(ConnectionLost):  # no certificate
            await round_trip(node.url, trusting(certs), "q")
        with pytest.raises(ConnectionLost):  # a certificate of another CA
            rogue_alice = TlsFiles(certs / "ca.crt", rogue / "n2.crt", rogue / "n2.key")
            await round_trip(node.url, rogue_alice, "q")
        assert stomp_round_trip(node.stomp_port, trusting(certs, "alice"), "st") == ["over tls"]
        assert stomp_refused(node.stomp_port, trusting(certs))
        assert stomp_refused(
            node.stomp_port, TlsFiles(certs / "ca.crt", rogue / "n2.crt", rogue / "n2.key")
        )
    finally:
        node.kill()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"key": "n2.key"}, "cannot be used together"),
        ({"ca": "missing.crt"}, "missing.crt: cannot read: No such file or directory"),
        ({"cert": "n1.key"}, "n1.key: not a certificate (PEM)"),
        ({"key": "n1.crt"}, "n1.crt: not a private key (PEM)"),
    ],
)
def test_a_node_with_unusable_tls_files_says_which_and_exits(
    tmp_path: Path, certs: Path, change: dict[str, str], said: str
) -> None:
    tls = {**tls_section(certs, "n1"), **{k: str(certs / v) for k, v in change.items()}}
    node = NodeProcess(tmp_path, {"tls": tls})
    ended = subprocess.run(
        node_command(node.config_path), capture_output=True, text=True, timeout=60
    )
    assert ended.returncode == 1
    assert "cannot start node" in ended.stdout + ended.stderr
    assert said in ended.stdout + ended.stderr


# ---- a cluster: mutual TLS ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, certs: Path) -> Iterator[ClusterNodes]:
    spec = grouping(NODES)
    for name in NODES:
        spec[name]["tls"] = tls_section(certs, name)
    nodes = ClusterNodes(tmp_path_factory.mktemp("tls-cluster"), spec).start()
    yield nodes
    nodes.kill_all()


async def test_a_group_crosses_the_cluster_over_mutual_tls(cluster: ClusterNodes) -> None:
    queue = "tls-orders"
    for name in NODES:
        async with cluster.client(name) as client:
            await client.create_queue(queue)
    async with (
        cluster.client("n3") as consumer_side,
        consumer_side.consumer(queue, prefetch=100) as consumer,
    ):
        cluster.wait_consumers(queue, {"n3": 1})
        async with cluster.client("n2") as producer_side:
            producer = producer_side.producer(queue, group_id="g1")
            for i in range(20):
                await producer.send(f"{i}")
        got = []
        while len(got) < 20 and (m := await consumer.receive(WAIT_S)) is not None:
            got.append(m)
        await consumer.ack_many(got, wait=True)
    assert [m.body.decode() for m in got] == [str(i) for i in range(20)]


def calls_on_the_cluster_listener(channel: grpc.Channel) -> dict[str, Callable[[], object]]:
    """A call of each kind a peer makes: gossip state, a vote, a grouping decision."""
    cluster, handler = cpb_grpc.ClusterStub(channel), gpb_grpc.GroupingHandlerStub(channel)
    return {
        "inspect": lambda: cluster.Inspect(cpb.InspectRequest(), timeout=3),
        "gossip": lambda: list(cluster.Gossip(iter(()), timeout=3)),
        "vote": lambda: cluster.Failover(cpb.FailoverEnvelope(), timeout=3),
        "list bindings": lambda: handler.List(gpb.ListRequest(), timeout=3),
    }


@pytest.mark.parametrize(
    "who", ["plain text", "rogue CA", "no client certificate", "a client certificate of the CA"]
)
def test_the_cluster_listener_admits_only_the_clusters_nodes(
    cluster: ClusterNodes, certs: Path, rogue: Path, who: str
) -> None:
    """Refused in the handshake, or (a client's certificate from the cluster's own CA, issued
    for client-auth) on every call: PERMISSION_DENIED."""
    address = cluster.cluster_addr["n1"]
    channel = {
        "plain text": lambda: grpc.insecure_channel(address),
        "rogue CA": lambda: grpc.secure_channel(
            address,
            TlsFiles(certs / "ca.crt", rogue / "n2.crt", rogue / "n2.key").channel_credentials(),
        ),
        "no client certificate": lambda: grpc.secure_channel(
            address, trusting(certs).channel_credentials()
        ),
        "a client certificate of the CA": lambda: grpc.secure_channel(
            address, trusting(certs, "mallory").channel_credentials()
        ),
    }[who]()
    code = grpc.StatusCode.UNAVAILABLE  # no TLS session at all
    if who == "a client certificate of the CA":
        code = grpc.StatusCode.PERMISSION_DENIED
    with channel:
        for kind, call in calls_on_the_cluster_listener(channel).items():
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == code, kind
    if who == "a client certificate of the CA":  # warned of once, naming the peer
        warned = [
            line
            for line in cluster.nodes["n1"].log().splitlines()
            if "a certificate that is not a node's refused" in line
        ]
        assert len(warned) == 1 and '"peer": "127.0.0.1:' in warned[0], warned
    # The cluster's own node certificate gets in.
    with cluster.nodes["n2"].channel(address) as channel:
        assert len(cpb_grpc.ClusterStub(channel).Inspect(cpb.InspectRequest(), timeout=5).nodes)


async def test_under_client_auth_required_a_certificate_names_the_user(
    tmp_path: Path, certs: Path
) -> None:
    """Security on, no password given: the verified certificate's subject is the user, if the
    users file has it (alice); a certificate of the right CA for no user (mallory) gets in
    nowhere."""
    users = tmp_path / "users.yaml"
    write_users(users, {"alice": UserEntry(hash_password("unused-Zq81"), ("admin",))})
    extra = {
        "node": {"id": "n1"},
        "tls": tls_section(certs, "n1", "required"),
        "security": {"enabled": True, "users-file": str(users)},
    }
    node = NodeProcess(tmp_path, extra).start()
    try:
        alice = trusting(certs, "alice")
        assert await round_trip(node.url, alice, "by-cert") == ["m0", "m1", "m2"]
        assert stomp_round_trip(node.stomp_port, alice, "by-cert-stomp") == ["over tls"]
        with pytest.raises(Unauthenticated, match="authentication failed"):
            await round_trip(node.url, trusting(certs, "mallory"), "by-cert")
    finally:
        node.kill()


@pytest.fixture(scope="module")
def expired(certs: Path) -> Path:
    """The cluster's CA, with a node certificate (old-n2) and a client's (old-alice) that it
    issued 400 days ago for one day: right issuer, expired."""
    real_now = certs_module._now
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(certs_module, "_now", lambda: real_now() - datetime.timedelta(days=400))
        write_certs(certs, ["old-n2"], clients=["old-alice"], reuse_ca=True, days=1)
    return certs


async def test_an_expired_certificate_is_refused_on_each_listener_that_checks_one(
    tmp_path: Path, expired: Path, cluster: ClusterNodes
) -> None:
    """The cluster listener (mutual TLS always) and, under client-auth required, the client
    and STOMP listeners refuse an expired certificate of their own CA; each still serves a
    client with a valid one afterwards."""
    old_node = TlsFiles(expired / "ca.crt", expired / "old-n2.crt", expired / "old-n2.key")
    address = cluster.cluster_addr["n1"]
    with grpc.secure_channel(address, old_node.channel_credentials()) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            cpb_grpc.ClusterStub(channel).Inspect(cpb.InspectRequest(), timeout=3)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    with cluster.nodes["n2"].channel(address) as channel:
        assert len(cpb_grpc.ClusterStub(channel).Inspect(cpb.InspectRequest(), timeout=5).nodes)

    node = start_node(tmp_path, expired, client_auth="required")
    try:
        with pytest.raises(ConnectionLost):
            await round_trip(node.url, trusting(expired, "old-alice"), "q")
        assert stomp_refused(node.stomp_port, trusting(expired, "old-alice"))
        assert not stomp_refused(node.stomp_port, trusting(expired, "alice"))
        assert await round_trip(node.url, trusting(expired, "alice"), "q2") == ["m0", "m1", "m2"]
        assert stomp_round_trip(node.stomp_port, trusting(expired, "alice"), "st2") == ["over tls"]
    finally:
        node.kill()
