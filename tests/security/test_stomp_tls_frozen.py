"""The drills' stomp.py client over TLS (tests/deploy_access.py) notices a frozen node while it
is frozen, and leaves its connection to one thread.

stomp.py on its own, on a heartbeat timeout, sends the TLS close from its heartbeat thread and
waits there for the frozen node's answer, while its receiver thread reads the same SSL object;
once the node thawed, both read it and a chaos run's process died (SIGSEGV in libssl). A real
node with TLS on its STOMP listener, frozen with SIGSTOP.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp
from conftest import NodeProcess
from deploy_access import ClientAccess
from waiting import wait

from pinmq.certs import write_certs

WAIT_S = 15.0


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    certs = tmp_path / "certs"
    write_certs(certs, ["n1"])
    tls = {"cert": "n1.crt", "key": "n1.key", "ca": "ca.crt"}
    tls = {key: str(certs / name) for key, name in tls.items()}
    started = NodeProcess(tmp_path, {"node": {"id": "n1"}, "tls": tls}).start()
    yield started
    if started.proc is not None:
        started.proc.send_signal(signal.SIGCONT)
    started.kill()


class _Listener(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.connected = threading.Event()
        self.timed_out = threading.Event()
        self.disconnected = threading.Event()

    def on_connected(self, frame: Any) -> None:
        self.connected.set()

    def on_heartbeat_timeout(self) -> None:
        self.timed_out.set()

    def on_disconnected(self) -> None:
        self.disconnected.set()


def test_a_frozen_node_is_noticed_while_frozen_and_its_socket_closed_by_one_thread(
    node: NodeProcess, tmp_path: Path
) -> None:
    hosts = [("localhost", node.stomp_port)]
    conn = stomp.Connection12(hosts, heartbeats=(200, 200), reconnect_attempts_max=1)
    listener = _Listener()
    conn.set_listener("test", listener)
    access = ClientAccess(ca=tmp_path / "certs" / "ca.crt")
    conn.connect(wait=True, **access.stomp(conn, hosts))
    assert listener.connected.wait(WAIT_S)  # told on stomp.py's receiver thread, maybe later
    assert node.proc is not None
    node.proc.send_signal(signal.SIGSTOP)
    try:
        assert listener.timed_out.wait(WAIT_S), "the heartbeat timeout came only once it thawed"
        assert listener.disconnected.wait(WAIT_S)
        wait("the receiver thread closed the socket", lambda: conn.transport.socket is None)
    finally:
        node.proc.send_signal(signal.SIGCONT)
