"""Audited grouped load for the ha drills (tests/ha/test_ha.py) and its verdict by `pinmq check`.

A queue on node1 (the pair), node2 and node3. Consumers: a Python client with the pair's
address list, a stomp.py connection with the pair's host list, and a Python client on each
REMOTE node; each acks as it goes while holding its newest deliveries out. Producers: Python
clients with the address list and on node2 or node3 (the groups bound elsewhere then reach
their queue by store-and-forward), and a stomp.py producer with the host list. Every process
audits, so do the clients (the STOMP ones through the drill's own audit log), and the drill
ends with `pinmq check` on the whole history: no loss, no duplicate, no order or exclusivity
violation, one route per binding and epoch.

The stomp.py clients take the pair's host list as stomp.py does (it tries them in order);
after a drop they start the list at the next host, since a frozen process still accepts TCP
connections and would otherwise be tried first forever.

Every client connects as its `ClientAccess` says: plain for the tests' own nodes, TLS and the
user admin for the shipped containers (tests/deploy_access.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import stomp
from deploy_access import ClientAccess
from drill_parts import Worker, clean_check

from broker.audit import MID_HEADER, AuditLog
from broker.client import AlreadyExists, Client, ConnectionLost, PinmqError
from broker.message import DUPLICATE_ID_HEADER

QUEUE = "orders"
GROUPS = 12
PY_GROUPS = range(0, 8)  # sent with the Python client: even ones through the pair, odd via node2
STOMP_GROUPS = range(8, GROUPS)  # sent with stomp.py through the pair
HOLD = 2
WAIT_S = 60.0
CONNECT_S = 3.0  # a host that accepted the TCP connection but sent no CONNECTED by then is left
AUDIT = {"audit": {"enabled": True, "flush-ms": 20}}
# How stomp.py's connect gives up: NotConnectedException when every host refused (between a
# kill and the backup serving), ConnectFailedException after its attempts.
NOT_CONNECTED = (
    stomp.exception.ConnectFailedException,
    stomp.exception.NotConnectedException,
    OSError,
)


def body(group: int, seq: int) -> bytes:
    return f"g{group:02d}-{seq}".encode()


class _Listener(stomp.ConnectionListener):
    """One stomp.py connection's events, as the drill's threads wait for them."""

    def __init__(self, on_message: Callable[[Any], None] | None = None) -> None:
        self.cond = threading.Condition()
        self.connected = False
        self.lost = False
        self.receipts: set[str] = set()
        self.on = on_message

    def _set(self, update: Callable[[], None]) -> None:
        with self.cond:
            update()
            self.cond.notify_all()

    def on_connected(self, frame: Any) -> None:
        self._set(lambda: setattr(self, "connected", True))

    def on_disconnected(self) -> None:
        self._set(lambda: setattr(self, "lost", True))

    def on_heartbeat_timeout(self) -> None:
        self._set(lambda: setattr(self, "lost", True))

    def on_error(self, frame: Any) -> None:  # the node closes the connection after an ERROR
        self._set(lambda: setattr(self, "lost", True))

    def on_receipt(self, frame: Any) -> None:
        self._set(lambda: self.receipts.add(frame.headers["receipt-id"]))

    def on_message(self, frame: Any) -> None:
        if self.on is not None:
            self.on(frame)

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Until `predicate` holds (True) or the connection is lost or `timeout` passes."""
        with self.cond:
            return self.cond.wait_for(lambda: predicate() or self.lost, timeout) and predicate()

    def is_connected(self) -> bool:
        return self.connected

    def receipt(self, receipt: str) -> bool:
        return self.wait(lambda: receipt in self.receipts, WAIT_S)


class StompLink:
    """stomp.py connections over a host list: a dropped one is replaced by a new connection
    whose list starts at the host after the one it was on."""

    def __init__(
        self, hosts: list[tuple[str, int]], stop: threading.Event, access: ClientAccess
    ) -> None:
        self.hosts, self.stop, self.access = hosts, stop, access
        self.start = 0
        self.conn: Any = None
        self.listener = _Listener()
        self.opened = 0  # connections made, the first included

    def open(self, on_message: Callable[[Any], None] | None = None) -> bool:
        """Connect (False if told to stop first); any earlier connection is dropped."""
        while not self.stop.is_set():
            self.close()
            hosts = self.hosts[self.start :] + self.hosts[: self.start]
            self.start = (self.start + 1) % len(self.hosts)
            conn = stomp.Connection12(
                hosts,
                heartbeats=(500, 500),
                reconnect_attempts_max=1,
                reconnect_sleep_initial=0.05,
                timeout=CONNECT_S,
            )
            listener = _Listener(on_message)
            conn.set_listener("drill", listener)
            login = self.access.stomp(conn, hosts)
            self.conn, self.listener = conn, listener
            with contextlib.suppress(*NOT_CONNECTED):
                conn.connect(wait=False, **login)
                if listener.wait(listener.is_connected, CONNECT_S):
                    self.opened += 1
                    return True
            time.sleep(0.1)
        return False

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.disconnect()
            with contextlib.suppress(Exception):
                conn.transport.disconnect_socket()  # its receiver thread ends, connected or not
            with contextlib.suppress(Exception):
                conn.transport.stop()


class StompProducer:
    """Sends each group's messages in order, one SEND with a receipt at a time; a send whose
    receipt did not come is sent again, the same message (same mid and duplicate id), on a
    new connection. `client_sent` is audited once the receipt came."""

    def __init__(
        self, hosts: list[tuple[str, int]], audit: AuditLog, name: str, access: ClientAccess
    ) -> None:
        self.stop = threading.Event()
        self.link = StompLink(hosts, self.stop, access)
        self.audit, self.name = audit, name
        self.confirmed: set[bytes] = set()
        self._n = 0

    def send(self, items: list[tuple[int, int]], pause_s: float) -> None:
        """(group, seq) items, in order; blocking (run it in a thread)."""
        for group, seq in items:
            self._n += 1
            mid = f"{self.name}/{self._n}"
            headers = {
                "JMSXGroupID": f"g{group:02d}",
                "JMSXGroupSeq": str(seq + 1),
                MID_HEADER: mid,
                DUPLICATE_ID_HEADER: mid,
                "persistent": "true",
            }
            attempt = 0
            while not self.stop.is_set():
                down = self.link.conn is None or self.link.listener.lost
                if down and not self.link.open():
                    return
                attempt += 1
                receipt = f"{mid}#{attempt}"
                listener = self.link.listener
                try:
                    self.link.conn.send(
                        f"/queue/{QUEUE}", body(group, seq), headers={**headers, "receipt": receipt}
                    )
                except (stomp.exception.NotConnectedException, OSError):
                    self.link.close()
                    continue
                if listener.receipt(receipt):
                    self.confirmed.add(body(group, seq))
                    self.audit.record(
                        "client_sent",
                        mid=mid,
                        address=QUEUE,
                        group=headers["JMSXGroupID"],
                        group_seq=seq + 1,
                        producer=self.name,
                    )
                    break
                self.link.close()
            time.sleep(pause_s)

    def close(self) -> None:
        self.stop.set()
        self.link.close()


class StompConsumer:
    """A client-individual subscription that acks (with a receipt) all but its newest HOLD
    messages; after a drop it subscribes again on a new connection and forgets what it held
    (the node delivers it again). Audited as the Python client does: `client_received`, and
    `client_acked` once the ACK is sent (its node may die before the receipt, and before
    its own audit log has the ack)."""

    def __init__(self, hosts: list[tuple[str, int]], audit: AuditLog, access: ClientAccess) -> None:
        self.audit = audit
        self.stop = threading.Event()
        self.drain = threading.Event()
        self.link = StompLink(hosts, self.stop, access)
        self.acked: set[bytes] = set()
        self._inbox: list[Any] = []
        self._cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="stomp-consumer", daemon=True)

    def _record(self, kind: str, frame: Any) -> None:
        h = frame.headers
        mid = h.get(MID_HEADER, "")
        self.audit.record(
            kind,
            mid=mid or None,
            address=QUEUE,
            queue=QUEUE,
            group=h.get("JMSXGroupID"),
            group_seq=int(h.get("JMSXGroupSeq", 0)) or None,
            producer=mid.rpartition("/")[0] or None,
            consumer_name="stomp-consumer",
        )

    def _arrived(self, frame: Any) -> None:
        self._record("client_received", frame)
        with self._cond:
            self._inbox.append((self.link.listener, frame))
            self._cond.notify_all()

    def _run(self) -> None:
        held: list[Any] = []
        n = 0
        while self.link.open(self._arrived):
            listener, conn = self.link.listener, self.link.conn
            held.clear()
            n += 1
            ready = f"sub-{n}"
            conn.subscribe(
                f"/queue/{QUEUE}", id="drill", ack="client-individual", headers={"receipt": ready}
            )
            if not listener.receipt(ready):
                continue
            while not listener.lost and not self.stop.is_set():
                with self._cond:
                    self._cond.wait_for(lambda: bool(self._inbox), 0.1)
                    arrived, self._inbox = self._inbox, []
                held.extend(frame for source, frame in arrived if source is listener)
                while held and (len(held) > HOLD or self.drain.is_set()):
                    frame = held.pop(0)
                    receipt = f"ack-{frame.headers['ack']}-{n}"
                    try:
                        conn.ack(frame.headers["ack"], receipt=receipt)
                    except (stomp.exception.NotConnectedException, OSError):
                        break
                    self._record("client_acked", frame)
                    # Without its receipt it may or may not have been done: counted either
                    # way, as it comes again if not.
                    listener.receipt(receipt)
                    self.acked.add(frame.body.encode())

    def close(self) -> None:
        self.stop.set()
        if self.thread.ident is not None:  # started
            self.thread.join(WAIT_S)
        self.link.close()


class Cluster(Protocol):
    """What the load needs of the cluster under test: processes (`HaCluster`) or containers."""

    @property
    def pair_url(self) -> str:
        """The pair's client addresses, as an address list."""

    @property
    def stomp_pair(self) -> list[tuple[str, int]]:
        """The pair's STOMP host list."""

    @property
    def others(self) -> tuple[str, ...]:
        """The nodes that are not the pair (node2 and node3 where node1 is the pair)."""

    def client_url(self, name: str) -> str:
        """The client address of one of `others`."""

    def stop_audited(self) -> dict[str, Path]:
        """Stop every node cleanly (each writes its audit tail); their audit directories."""


async def connected(client: Client) -> None:
    """Connect as an application would, trying again while nothing answers (nothing is sent
    before): a node just restarted may refuse a moment longer than its health check says."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while True:
        try:
            await client.connect()
            return
        except ConnectionLost:
            if asyncio.get_running_loop().time() >= deadline:
                raise
            await asyncio.sleep(0.2)


CLOSE_LIMIT_S = 30.0  # cancelled consumers end in a moment: past this one ignored its cancel


class HaLoad:
    """The drill's clients on a cluster whose nodes audit, and the verdict."""

    def __init__(self, ha: Cluster, history: Path, access: ClientAccess | None = None) -> None:
        self.ha, self.history = ha, history
        self.access = access or ClientAccess()
        self.clients_dir = history / "clients"
        self.clients_dir.mkdir(parents=True)
        self.drain = asyncio.Event()
        self.workers: list[Worker] = []
        self.clients: list[Client] = []
        self.confirmed: set[bytes] = set()
        self.failures: list[str] = []  # sends that failed for good, and why
        self.urls: dict[str, str] = {}  # each worker's addresses
        names = ("stomp-producer", "stomp-consumer")
        self.stomp_audits = [AuditLog(self.clients_dir, name).start() for name in names]
        pair, audits = ha.stomp_pair, self.stomp_audits
        self.stomp_producer = StompProducer(pair, audits[0], "stomp-producer", self.access)
        self.stomp_consumer = StompConsumer(pair, audits[1], self.access)
        self._closed = False

    async def start(self) -> None:
        """The queue everywhere, then every consumer."""
        others = self.ha.others
        for url in (self.ha.pair_url, *map(self.ha.client_url, others)):
            async with self.access.client(url) as client:
                with contextlib.suppress(AlreadyExists):  # configured statically (compose)
                    await client.create_queue(QUEUE)
        await self.add_worker("py-pair", self.ha.pair_url)
        for name in others:
            await self.add_worker(f"py-{name}", self.ha.client_url(name))
        self.stomp_consumer.thread.start()

    async def add_worker(self, name: str, url: str) -> Worker:
        """A Python consumer on `url` (an address list: it fails over)."""
        client = self.access.client(url, audit=self.clients_dir, audit_name=name)
        await connected(client)  # a node just restarted may refuse a moment after it is healthy
        self.clients.append(client)
        worker = Worker(name, hold=HOLD, failover="," in url)
        worker.task = asyncio.create_task(worker.run(client, QUEUE, self.drain))
        self.workers.append(worker)
        self.urls[name] = url
        return worker

    async def send(
        self,
        turns: range,
        pause_s: float = 0.01,
        remote: str | None = None,
        python: Iterable[int] = PY_GROUPS,
        stomp: bool = True,
    ) -> None:
        """Every group's messages of `turns`, the groups concurrently, one at a time each; the
        odd Python groups through `remote` (a node that is not the pair; the first of them).
        `python` and `stomp` choose the groups (the chaos run sends each on its own).

        A Python send that fails for good ends its group's part (what was confirmed counts).
        """

        others = self.ha.others

        async def python_group(g: int) -> None:
            url = self.ha.pair_url if g % 2 == 0 else self.ha.client_url(remote or others[0])
            name = f"py-g{g:02d}-{turns.start}"
            client = self.access.client(url, audit=self.clients_dir, audit_name=name)
            await connected(client)
            try:
                producer = client.producer(QUEUE, group_id=f"g{g:02d}")
                for i in turns:
                    try:
                        await producer.send(body(g, i))
                    except PinmqError as err:
                        self.failures.append(f"g{g:02d}-{i} via {url}: {err}")
                        return
                    self.confirmed.add(body(g, i))
                    await asyncio.sleep(pause_s)
            finally:
                await client.close()

        def stomp_groups() -> None:
            items = [(g, i) for i in turns for g in STOMP_GROUPS]
            self.stomp_producer.send(items, pause_s / len(STOMP_GROUPS))

        stomp_part = [asyncio.to_thread(stomp_groups)] if stomp else []
        await asyncio.gather(*map(python_group, python), *stomp_part)
        self.confirmed |= self.stomp_producer.confirmed

    @staticmethod
    def group_keys() -> list[str]:
        """The load's groups as the checker names them: queue/group."""
        return [f"{QUEUE}/g{g:02d}" for g in range(GROUPS)]

    async def send_new_group(self, group: int, url: str) -> None:
        """One message of a group never sent before: its binding is new."""
        named = f"py-new-g{group}"
        async with self.access.client(url, audit=self.clients_dir, audit_name=named) as client:
            await self.send_first(client, group)

    async def producing_client(self, name: str, url: str, **options: Any) -> Client:
        """An audited client of `url`, connected (`options`: call_timeout, ...), closed with
        the load's."""
        client = self.access.client(url, audit=self.clients_dir, audit_name=name, **options)
        await connected(client)
        self.clients.append(client)
        return client

    async def send_first(self, client: Client, group: int) -> None:
        """The first message of group `group` through `client`; confirmed once it returns."""
        await client.producer(QUEUE, group_id=f"g{group:02d}").send(body(group, 0))
        self.confirmed.add(body(group, 0))

    def acked(self) -> set[bytes]:
        every = set(self.stomp_consumer.acked)
        for w in self.workers:
            every |= w.acked | w.unsure
        return every

    async def drained(self) -> None:
        """Until every confirmed message is acked by some consumer."""
        self.drain.set()
        self.stomp_consumer.drain.set()
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while not self.confirmed <= self.acked():
            missing = sorted(self.confirmed - self.acked())
            assert asyncio.get_running_loop().time() < deadline, (
                f"{len(missing)} of {len(self.confirmed)} confirmed never acked: {missing[:10]}"
            )
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        """Stop every client and close the audit logs (again: nothing more)."""
        if self._closed:
            return
        self._closed = True
        self.stomp_producer.close()
        await asyncio.to_thread(self.stomp_consumer.close)
        tasks = [w.task for w in self.workers if w.task is not None]
        for task in tasks:
            task.cancel()
        try:
            async with asyncio.timeout(CLOSE_LIMIT_S):  # a consumer that ignores its cancel
                await asyncio.gather(*tasks, return_exceptions=True)
        except TimeoutError:
            running = [w.name for w in self.workers if w.task is not None and not w.task.done()]
            raise AssertionError(f"consumers still running after their cancel: {running}") from None
        for client in self.clients:
            await client.close()
        for audit in self.stomp_audits:
            audit.close()

    async def finish(self, report: Path) -> dict[str, Any]:
        """Drain, close the clients, and the verdict."""
        await self.drained()
        await self.close()
        return await self.verdict(report)

    async def verdict(self, report: Path) -> dict[str, Any]:
        """Stop every node cleanly (each writes its audit tail), gather every audit log,
        require a clean `pinmq check`; its stats."""
        for name, audit in (await asyncio.to_thread(self.ha.stop_audited)).items():
            if audit.exists():
                shutil.copytree(audit, self.history / name)
        return await clean_check(self.history, report)
