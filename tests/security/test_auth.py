"""Users and permissions against a real node process with `security` on: STOMP over raw
sockets, the Python client, the CLI and HTTP. After every refusal, what the refused
operation would have changed is checked unchanged.

Roles (most specific pattern wins, as Artemis' security-settings): on `orders.#`, `app`
sends, `worker` consumes, `ops` browses and `admin` creates, deletes and manages; elsewhere
`admin` may do everything.
"""

from __future__ import annotations

import base64
import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import NodeProcess, Scrape, cli, get, unique
from ports import reserve_port
from stomp_helpers import Raw
from waiting import until, wait

from broker.audit import read_events, segments
from broker.client import Client, Forbidden, Unauthenticated
from broker.users import UserEntry, hash_password, read_users, write_users
from pinmq.stomp.frames import encode_frame

PASSWORDS = {name: f"pw-{name}-Zq81" for name in ("admin", "app", "worker", "ops")}
ROLES = {
    "orders.#": {
        "send": ["app"],
        "consume": ["worker"],
        "browse": ["ops"],
        "create": ["admin"],
        "delete": ["admin"],
        "manage": ["admin"],
    },
    "#": {p: ["admin"] for p in ("send", "consume", "browse", "create", "delete", "manage")},
}


@dataclass
class Secured:
    node: NodeProcess
    users_file: Path

    def client(self, user: str | None, password: str | None = None) -> Client:
        if user is not None and password is None:
            password = PASSWORDS[user]
        return Client(self.node.url, user=user, password=password)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    tmp = tmp_path_factory.mktemp("secured")
    users_file = tmp / "users.yaml"
    write_users(
        users_file,
        {name: UserEntry(hash_password(pw), (name,)) for name, pw in PASSWORDS.items()},
    )
    extra = {
        "security": {"enabled": True, "users-file": str(users_file), "roles": ROLES},
        "audit": {"enabled": True, "flush-ms": 10},
    }
    node = NodeProcess(tmp, extra).start()
    yield Secured(node, users_file)
    node.kill()


def stomp_connect(port: int, **headers: str) -> tuple[Raw, list]:
    """CONNECT with `headers`; the frames until the node closed, or [CONNECTED] if it stays."""
    raw = Raw(port)
    raw.send(encode_frame("CONNECT", {"accept-version": "1.2", "host": "h", **headers}))
    first = raw.frame()
    if first.command == "CONNECTED":
        return raw, [first]
    return raw, [first, *raw.until_closed()]


def test_a_wrong_password_an_unknown_user_and_no_login_get_the_same_stomp_refusal(
    secured: Secured,
) -> None:
    answers = []
    for headers in (
        {"login": "app", "passcode": "wrong"},
        {"login": "nobody", "passcode": "whatever"},
        {},
    ):
        raw, frames = stomp_connect(secured.node.stomp_port, **headers)
        with raw:
            assert [f.command for f in frames] == ["ERROR"]
            answers.append((frames[0].headers["message"], frames[0].body))
    assert answers == [("authentication failed", b"authentication failed")] * 3
    raw, frames = stomp_connect(secured.node.stomp_port, login="app", passcode=PASSWORDS["app"])
    with raw:
        assert frames[0].command == "CONNECTED"


def stomp_as(secured: Secured, user: str) -> Raw:
    raw, frames = stomp_connect(secured.node.stomp_port, login=user, passcode=PASSWORDS[user])
    assert frames[0].command == "CONNECTED", frames
    return raw


async def depth_as_ops(secured: Secured, queue: str) -> int | None:
    """The queue's depth as `ops` (browse on orders.#) sees it; None if there is no queue."""
    async with secured.client("ops") as ops:
        return next((q.depth for q in await ops.queues() if q.name == queue), None)


async def test_stomp_send_and_subscribe_need_their_permissions(secured: Secured) -> None:
    queue = unique("orders.stomp")
    async with secured.client("admin") as admin:
        await admin.create_queue(queue)
    with stomp_as(secured, "app") as app:
        app.send(encode_frame("SEND", {"destination": queue, "receipt": "r1"}, b"ok"))
        assert app.frame().command == "RECEIPT"
        app.send(encode_frame("SUBSCRIBE", {"destination": queue, "id": "s", "receipt": "r"}))
        refused = [app.frame(), *app.until_closed()]
    assert refused[0].command == "ERROR"
    assert (
        refused[0].headers["message"]
        == f"user 'app' lacks permission 'consume' on address {queue!r}"
    )
    with stomp_as(secured, "worker") as worker:
        worker.send(encode_frame("SEND", {"destination": queue, "receipt": "r2"}, b"no"))
        refused = [worker.frame(), *worker.until_closed()]
    assert (
        refused[0].headers["message"]
        == f"user 'worker' lacks permission 'send' on address {queue!r}"
    )
    assert await depth_as_ops(secured, queue) == 1  # the refused SEND enqueued nothing
    with stomp_as(secured, "worker") as worker:
        worker.send(encode_frame("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "auto"}))
        message = worker.frame()
        assert message.command == "MESSAGE" and message.body == b"ok"


async def test_without_create_a_send_or_subscribe_does_not_auto_create(secured: Secured) -> None:
    queue = unique("orders.new")
    with stomp_as(secured, "app") as app:
        app.send(encode_frame("SEND", {"destination": queue}, b"x"))
        refused = [app.frame(), *app.until_closed()]
    assert "lacks permission 'create'" in refused[0].headers["message"]
    with stomp_as(secured, "worker") as worker:
        worker.send(encode_frame("SUBSCRIBE", {"destination": queue, "id": "s"}))
        refused = [worker.frame(), *worker.until_closed()]
    assert "lacks permission 'create'" in refused[0].headers["message"]
    async with secured.client("app") as app:
        with pytest.raises(Forbidden, match="'create'"):
            await app.producer(queue).send("x")
    async with secured.client("admin") as admin:
        assert queue not in {q.name for q in await admin.queues()}


async def test_grpc_clients_authenticate_and_are_held_to_their_permissions(
    secured: Secured,
) -> None:
    queue = unique("orders.grpc")
    for user, password in ((None, None), ("app", "wrong"), ("nobody", "x")):
        async with secured.client(user, password) as client:
            with pytest.raises(Unauthenticated, match="authentication failed"):
                await client.producer(queue).send("x")
    async with secured.client("admin") as admin:
        await admin.create_queue(queue)
    async with secured.client("app") as app:
        await app.producer(queue, group_id="g").send_many(["1", "2"])
        with pytest.raises(Forbidden, match=f"lacks permission 'consume' on address '{queue}'"):
            await app.consumer(queue).receive(1)
        assert await app.queues() == []  # it may browse nothing
        with pytest.raises(Forbidden, match="'browse'"):
            await app.groups(queue)
    async with secured.client("worker") as worker:
        with pytest.raises(Forbidden, match=f"lacks permission 'send' on address '{queue}'"):
            await worker.producer(queue).send("3")
        async with worker.consumer(queue) as consumer:
            got = await consumer.receive(5)
            assert got is not None and got.body == b"1"
    async with secured.client("ops") as ops:
        assert [g.group for g in await ops.groups(queue)] == ["g"]
        with pytest.raises(Forbidden, match="'manage'"):
            await ops.reset_groups(queue)
        with pytest.raises(Forbidden, match="'delete'"):
            await ops.delete_queue(queue)
        with pytest.raises(Forbidden, match="'manage' on every address"):
            await ops.cluster_status()
        assert [g.group for g in await ops.groups(queue)] == ["g"]  # still pinned
    assert await depth_as_ops(secured, queue) == 2  # the refused send added nothing


def test_the_cli_takes_a_user_and_a_password_file_never_a_password_in_argv(
    secured: Secured, tmp_path: Path
) -> None:
    queue = unique("orders.cli")
    secret = tmp_path / "app.password"
    secret.write_text(PASSWORDS["app"] + "\n")
    url = ["--url", secured.node.url]
    sent = cli(
        "send", queue, "--body", "x", *url, "--user", "admin", "--password-file", str(secret)
    )
    assert sent.returncode != 0 and "authentication failed" in sent.stderr
    created = cli(
        "send", queue, "--body", "x", *url, "--user", "app", "--password-file", str(secret)
    )
    assert created.returncode != 0
    assert (
        created.stderr.strip()
        .splitlines()[-1]
        .endswith(f"user 'app' lacks permission 'create' on address {queue!r}")
    )
    assert PASSWORDS["app"] not in sent.stderr + sent.stdout + created.stderr + created.stdout


def http_get(address: str, path: str, user: str | None = None) -> tuple[int, bytes]:
    """(status, body) of GET http://address/path, as `user` (basic authentication) if given."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    headers = {}
    if user is not None:
        token = base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    try:
        conn.request("GET", path, headers=headers)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def test_http_probes_stay_open_and_every_other_path_needs_manage(secured: Secured) -> None:
    http = secured.node.http
    assert http_get(http, "/healthz")[0] == 200
    assert http_get(http, "/readyz")[0] == 200
    assert http_get(http, "/metrics")[0] == 401
    assert http_get(http, "/metrics", "ops")[0] == 403
    status, body = http_get(http, "/metrics", "admin")
    assert status == 200
    assert Scrape.parse(body.decode()).value("pinmq_memory_limit_bytes") > 0
    assert http_get(http, "/nope", "admin")[0] == 404  # past the guard: nothing there
    for console in ("/", "/console/console.js", "/api/cluster", "/api/groups?group=g"):
        assert http_get(http, console)[0] == 401
        assert http_get(http, console, "ops")[0] == 403
        assert http_get(http, console, "admin")[0] == 200


def test_a_passive_pair_process_guards_its_metrics_and_console_too(
    secured: Secured, tmp_path: Path
) -> None:
    """A backup whose primary never answers stays passive: it serves only listen.http, and
    its metrics (its failover role) and its console need `manage` like the active node's."""
    extra = {
        "node": {"id": "lone-backup"},
        "listen": {"cluster": f"127.0.0.1:{reserve_port()}"},
        "cluster": {"connectors": [f"127.0.0.1:{reserve_port()}"]},  # a voter that never answers
        "grouping-handler": {"type": "LOCAL"},
        "ha": {"role": "backup", "primary": f"127.0.0.1:{reserve_port()}"},
        "security": {"enabled": True, "users-file": str(secured.users_file), "roles": ROLES},
    }

    def up() -> bool:
        return get(backup.http, "/healthz")[0] == 200

    backup = NodeProcess(tmp_path, extra).start(wait=False)
    try:
        wait("the backup's listen.http", up, ignoring=(OSError,))
        assert http_get(backup.http, "/metrics")[0] == 401
        assert http_get(backup.http, "/metrics", "ops")[0] == 403
        status, body = http_get(backup.http, "/metrics", "admin")
        assert status == 200
        scraped = Scrape.parse(body.decode())
        roles = {s.labels["role"]: s.value for s in scraped.samples if s.name == "pinmq_ha_role"}
        assert sum(roles.values()) == 1 and roles["passive"] + roles["pre-candidate"] == 1
        assert scraped.value("pinmq_ha_backup_in_sync", node="lone-backup") == 0
        assert scraped.labels("pinmq_queue_pending_messages") == []  # no node runs here
        assert http_get(backup.http, "/api/cluster")[0] == 401
        status, body = http_get(backup.http, "/api/cluster", "admin")
        assert status == 200  # its console says that it is passive, and why
        assert json.loads(body)["readiness"]["reasons"][0].startswith("passive: ")
    finally:
        backup.kill()


async def test_a_user_added_to_the_file_logs_in_without_a_restart(secured: Secured) -> None:
    users = read_users(secured.users_file)
    try:
        late_user = UserEntry(hash_password("pw-late"), ("app",))
        write_users(secured.users_file, {**users, "late": late_user})
        async with Client(secured.node.url, user="late", password="pw-late") as late:
            with pytest.raises(Forbidden, match="user 'late' lacks permission 'create'"):
                await late.producer(unique("orders.late")).send("x")
    finally:
        write_users(secured.users_file, users)


async def test_refusals_are_audited_and_no_password_is_logged(secured: Secured) -> None:
    queue = unique("orders.audit")
    async with secured.client("worker") as worker:
        with pytest.raises(Forbidden):
            await worker.producer(queue).send("x")
    async with secured.client("app", "wrong-Zq81") as bad:
        with pytest.raises(Unauthenticated):
            await bad.producer(queue).send("x")
    audit = secured.node.data_dir / "audit"

    def denied() -> list[dict]:
        return [e for p in segments(audit) for e in read_events(p) if e["kind"] == "denied"]

    await until(
        "both refusals audited",
        lambda: (
            {(e.get("user"), e.get("permission"), e.get("address")) for e in denied()}
            >= {("worker", "send", queue), ("app", None, None)}
        ),
    )
    assert all(e["peer"].startswith("127.0.0.1:") for e in denied())
    written = json.dumps([e for p in segments(audit) for e in read_events(p)])
    for text in (written, secured.node.log()):
        assert not any(pw in text for pw in PASSWORDS.values())
        assert "wrong-Zq81" not in text and "$argon2id$" not in text


def test_a_stomp_load_with_a_wrong_password_stops_at_once_saying_so(
    secured: Secured, tmp_path: Path
) -> None:
    secret = tmp_path / "app.password"
    secret.write_text(PASSWORDS["app"] + "\n")
    stomp = ["--url", f"127.0.0.1:{secured.node.stomp_port}", "--protocol", "stomp"]
    done = cli(
        "load", "--queue", unique("orders.load"), *stomp, "--duration", "5",
        "--user", "admin", "--password-file", str(secret),
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().endswith("refused the connection: authentication failed")
    assert "sent" not in done.stdout  # not one progress line: nothing ran
    assert PASSWORDS["app"] not in done.stderr + done.stdout
