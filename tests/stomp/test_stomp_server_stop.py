"""A STOMP connection whose TLS handshake ends after the server's `stop` looked at its
connections would outlive the node's stop (its task left pending when the loop closed, which
asyncio logged as an error in a chaos run): `_accept` closes it at once instead."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from broker.config import NodeConfig
from broker.engine import Engine
from broker.sending import LocalSendPath
from pinmq.stomp.server import StompServer


async def test_a_connection_accepted_after_stop_is_closed_at_once(tmp_path: Path) -> None:
    config = NodeConfig.model_validate({"node": {"id": "n", "data-dir": str(tmp_path)}})
    engine = Engine(config, lambda: True)
    server = StompServer(engine, LocalSendPath())
    await server.stop()
    ours, theirs = socket.socketpair()
    try:
        reader, writer = await asyncio.open_connection(sock=ours)
        # Without the check it would wait for a CONNECT frame for connect-timeout-ms (10 s).
        await asyncio.wait_for(server._accept(reader, writer), timeout=2)
        assert server.connections == set()
        theirs.settimeout(5)
        assert theirs.recv(1) == b""  # closed: the client sees the end at once
    finally:
        theirs.close()
        await engine.close()
