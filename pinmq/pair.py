"""One process of a node's pair (`ha` section, LOCAL or REMOTE): it serves as the logical node while
its failover member is active and holds its quorum, and follows the active process otherwise.

Active: a full `Node` answering for the logical node id (node1), its writes replicated to the
peer and gated by the failover shell (`cluster/ha.py`). Passive: a `Follower` of the active
process's stores (`cluster/replica.py`), a cluster listener that answers failover messages
only, and the HTTP endpoint (its metrics: the pair member's state; its console says which
process holds the node); the client and STOMP listeners stay closed. The switch happens
whenever the member's role or quorum changes: a process that stops holding its quorum stops
its node at once (it fences itself) and serves nothing until it is elected again.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from grpc import aio

from broker import channels, logs
from broker.authenticator import Authenticator
from broker.config import NodeConfig
from broker.engine import StartupError
from broker.kept_index import KeptIndex
from broker.readiness import Readiness
from broker.users import UsersFileError
from cluster.connector import SERVER_OPTIONS
from cluster.failover_states import Role
from cluster.ha import PairShell, PassiveService, VoterRegistry
from cluster.node_certificates import cluster_server
from cluster.replica import Follower, recover
from pinmq.console import Console, ConsoleSources
from pinmq.http import HttpServer
from pinmq.metrics import NodeCollector
from pinmq.node import Node
from pinmq_pb import cluster_pb2_grpc as pb_grpc

log = logs.get("pair")
RETRY_S = 0.2  # after a failed start as the active process


class PairProcess:
    """The pair member's process, with `Node`'s lifecycle (`start`, `stop`, `failed`)."""

    def __init__(self, config: NodeConfig) -> None:
        assert config.ha is not None and config.cluster is not None
        self.config = config
        self.data_dir = Path(config.node.data_dir)
        self.shell = PairShell(config, self._changed)
        self.failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        self.node: Node | None = None
        self.follower: Follower | None = None
        self._following: asyncio.Task[None] | None = None
        self._passive: aio.Server | None = None
        self._http: HttpServer | None = None
        self._authenticator: Authenticator | None = None  # the passive HTTP's, with security
        self._lock = asyncio.Lock()
        self._stopping = False
        self._again = False
        self._reconciling: asyncio.Future[None] | None = None

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # A snapshot install cut short by a crash is finished (or dropped) before anything,
        # the failover shell included, relies on what the files hold.
        await asyncio.to_thread(recover, self.data_dir)
        try:
            self._authenticator = Authenticator.of(self.config.security, None)
            await self._serve_passively()
        except (OSError, UsersFileError) as err:
            raise StartupError(str(err)) from None
        self.shell.start()
        log.info("pair member started", **self.shell.describe())
        self._changed()  # a backup follows its primary from the start

    async def stop(self, grace_s: float = 5.0) -> None:
        self._stopping = True
        async with self._lock:
            await self.shell.stop()
            if self.node is not None:
                await self.node.stop(grace_s)
                self.node = None
            await self._stop_following()
            await self._stop_passive()
        if self._authenticator is not None:
            self._authenticator.close()
        log.info("pair member stopped", **self.shell.describe())

    # ---- switching between active and passive

    def _changed(self) -> None:
        if self._stopping:
            return
        if self._lock.locked():
            self._again = True
            return
        self._reconciling = asyncio.ensure_future(self._reconcile())

    async def _reconcile(self) -> None:
        async with self._lock:
            while True:
                self._again = False
                await self._reconcile_once()
                if not self._again or self._stopping:
                    return

    async def _reconcile_once(self) -> None:
        member = self.shell.member
        serve = member.role is Role.ACTIVE and self.shell.may_serve()
        node = self.node
        if node is not None and node.failed.done():
            if serve:  # not fenced: the node itself broke (its store): the process ends
                if not self.failed.done():
                    self.failed.set_result(node.failed.result())
                return
            await self._go_passive()  # a write refused as fenced failed it: we knew
        elif serve and self.node is None:
            await self._go_active()
        elif not serve and self.node is not None:
            await self._go_passive()
        elif self.node is None and member.role is not Role.ACTIVE:
            self._follow()

    async def _go_active(self) -> None:
        logical = self.shell.logical
        assert logical is not None
        kept = await self._stop_following()
        await self._stop_passive()
        node_section = self.config.node.model_copy(update={"id": logical})
        config = self.config.model_copy(update={"node": node_section})
        node = Node(config, pair=self.shell)
        try:
            await node.start(kept)
        except StartupError as err:
            log.error("cannot serve as the active process: trying again", error=str(err))
            await self._serve_passively()
            # Still elected: try again shortly rather than hold the node without serving it.
            asyncio.get_running_loop().call_later(RETRY_S, self._changed)
            return
        self.node = node
        node.failed.add_done_callback(lambda _: self._changed())
        epoch, replaced = self.shell.epoch, self.shell.member.took_over
        if replaced is None:  # a start, or a handover
            log.info("serving as the active process", logical=logical, epoch=epoch)
        else:  # it followed an active that fell silent
            log.warning(
                "took over: serving as the active process",
                logical=logical,
                epoch=epoch,
                replaced=replaced,
            )

    async def _go_passive(self) -> None:
        node, self.node = self.node, None
        assert node is not None
        log.warning("stopped serving: fenced", **self.shell.describe())
        await node.stop(0)
        await self._serve_passively()

    async def _serve_passively(self) -> None:
        if self._passive is None:
            # As the active process's listener: peers' keepalive pings permitted (else a
            # GOAWAY too_many_pings every few seconds), the port not shared.
            server = cluster_server(self.shell.tls, SERVER_OPTIONS)
            pb_grpc.add_ClusterServicer_to_server(
                PassiveService(self.shell, VoterRegistry(self.data_dir)), server
            )
            # Mutual TLS, as on the active process's listener: only the cluster's own nodes.
            channels.listen(server, self.config.listen.cluster, self.shell.tls, client_cert=True)
            await server.start()
            self._passive = server
        if self._http is None:
            node_id = self.config.node.id
            metrics = NodeCollector(node_id, ha=self._ha).registry()
            console = Console(ConsoleSources(node_id, self.readiness))  # it says who serves
            http = HttpServer.of(
                self.config, self.readiness, self._authenticator, metrics, console.routes()
            )
            await http.start()
            self._http = http

    async def _stop_passive(self) -> None:
        if self._passive is not None:
            await self._passive.stop(0)
            self._passive = None
        if self._http is not None:
            await self._http.stop()
            self._http = None

    def _follow(self) -> None:
        address = self.shell.peer_address
        if self._following is not None or not address:
            return
        self.follower = Follower(
            self.config.node.id,
            address,
            self.data_dir,
            retry_s=self.config.cluster.reconnect_interval / 1000,  # type: ignore[union-attr]
            warn_after_s=self.shell.grace_s,
            cluster_address=self.config.pair_address,
            tls=self.shell.tls,
            on_synced=self.shell.replica_synced,
            on_broken=self.shell.replica_broke,
        )
        self._following = asyncio.create_task(self.follower.run(), name="follow-active")

    async def _stop_following(self) -> KeptIndex | None:
        """Stop following; the index of the store as the follower kept it, if it has one."""
        task, self._following = self._following, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        follower, self.follower = self.follower, None
        if follower is None:
            return None
        await follower.close()  # every write it took is on disk, as in the index
        self.shell.replica_broke()
        return follower.index

    # ---- health

    def readiness(self) -> Readiness:
        if self.node is not None:
            return self.node.readiness()
        ha = self._ha()
        details = {
            "node": self.config.node.id,
            "role": "backup",
            "serving": False,
            "ha": ha,
            "reasons": [f"passive: {ha.get('active') or 'no process'} holds the node"],
        }
        return Readiness(False, details)

    def _ha(self) -> dict[str, Any]:
        """The member's state, and while it follows, its replication's."""
        ha: dict[str, Any] = dict(self.shell.describe())
        if self.follower is not None:
            ha.update(self.follower.status())
        return ha
