"""A cluster member that stops starts no bridge after it: `stop` stops the bridges it finds,
and one started after that (a message routed to a peer while the node stopped) was left
pending and collected later: "Task was destroyed but it is pending" in a chaos run's logs.
Its messages wait in their store-and-forward queue for the next start. A real engine and
cluster member on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

from engine_queue import one_queue
from ports import reserve_port

from broker.config import NodeConfig
from broker.engine import Engine
from broker.message import Outgoing
from cluster.member import ClusterMember


def _bridges() -> list[str]:
    return sorted(t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("bridge:"))


async def test_no_bridge_starts_once_the_member_stopped(tmp_path: Path) -> None:
    config = NodeConfig.model_validate(
        {
            "node": {"id": "n1", "data-dir": str(tmp_path)},
            "listen": {"cluster": f"127.0.0.1:{reserve_port()}"},
            "cluster": {"reconnect-interval": 50},
        }
    )
    engine = Engine(config)
    async with one_queue(engine):
        member = ClusterMember(engine)
        await member.start()
        member.forwarding("n2", "q", Outgoing("q", b"to n2", {}, True))
        assert _bridges() == ["bridge:n2"]
        await member.stop()
        assert _bridges() == []
        member.forwarding("n3", "q", Outgoing("q", b"to n3", {}, True))
        assert _bridges() == []
