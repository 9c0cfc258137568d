"""`listen.http`: liveness and readiness over real HTTP, from real node processes."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_nodes import ClusterNodes, grouping
from conftest import NodeProcess, cli, get

from broker.readiness import assess


def test_a_standalone_node_is_alive_and_ready(node_factory: Callable[..., NodeProcess]) -> None:
    node = node_factory()
    node_id = f"test-{node.port}"
    assert get(node.http, "/healthz") == (200, {"node": node_id, "alive": True})
    status, body = get(node.http, "/readyz")
    assert status == 200
    assert body["ready"] is True and body["reasons"] == []
    assert body["node"] == node_id and body["role"] == "standalone"
    assert body["store_open"] is True and body["serving"] is True
    assert body["grouping_handler"] is None and body["peers"] is None
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"http://{node.http}/nope", timeout=5)
    assert missing.value.code == 404


def test_a_taken_http_port_stops_the_node_at_start_naming_it(
    node_factory: Callable[..., NodeProcess],
) -> None:
    node = node_factory(start=False)
    host, port = node.http.rsplit(":", 1)
    with socket.socket() as squatter:
        squatter.bind((host, int(port)))
        squatter.listen()
        with pytest.raises(RuntimeError, match="node exited with 1"):
            node.start()
    assert f"cannot listen on {node.http}" in node.log()
    assert "listen.http" in node.log()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[ClusterNodes]:
    nodes = ClusterNodes(tmp_path, grouping(["n1", "n2"]))
    yield nodes.start()
    nodes.kill_all()


def test_a_remote_node_is_ready_only_while_it_reaches_the_local_handler(
    pair: ClusterNodes,
) -> None:
    """`/readyz` says why not, and so does `pinmq status --cluster` (once)."""
    n1, n2 = pair.nodes["n1"], pair.nodes["n2"]
    status, body = get(n1.http, "/readyz")
    assert status == 200 and body["role"] == "arbiter"
    assert body["grouping_handler"] == {"type": "LOCAL", "local": "n1", "reachable": True}
    assert body["peers"] == {"n2": True} and body["peers_linked"] == 1
    status, body = get(n2.http, "/readyz")
    assert status == 200 and body["role"] == "remote"
    assert body["grouping_handler"] == {"type": "REMOTE", "local": "n1", "reachable": True}

    pair.stop("n1")
    pair.wait("n2 to report not ready", lambda: get(n2.http, "/readyz")[0] == 503)
    status, body = get(n2.http, "/readyz")
    assert body["ready"] is False and body["peers"] == {"n1": False}
    assert body["reasons"] == ["LOCAL grouping handler n1 not reachable"]
    assert get(n2.http, "/healthz")[0] == 200  # alive all the same: no reason to restart it
    status = cli("status", "--cluster", "--url", n2.url)
    assert status.stdout.count("not ready:") == 1, status.stderr
    assert "not ready: LOCAL grouping handler n1 not reachable" in status.stdout
    as_json = json.loads(cli("status", "--json", "--url", n2.url).stdout)
    assert as_json["not_ready"] == ["LOCAL grouping handler n1 not reachable"]

    pair.start("n1")
    pair.wait("n2 to be ready again", lambda: get(n2.http, "/readyz")[0] == 200)
    status = cli("status", "--cluster", "--url", n2.url)
    assert status.returncode == 0 and "not ready" not in status.stdout


# ---- the decision itself (pure) ------------------------------------------------------------


def facts(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "node_id": "n2",
        "serving": True,
        "store_open": True,
        "failed": None,
        "clustered": True,
        "handler_type": "REMOTE",
        "local_handler": "n1",
        "peers": {"n1": True, "n3": False},
        "problems": [],
    }
    return {**base, **changes}


def test_a_peer_that_is_down_is_reported_but_does_not_make_the_node_unready() -> None:
    state = assess(**facts())
    assert state.ready and state.details["peers_linked"] == 1


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"serving": False}, "not serving (starting or stopping)"),
        ({"store_open": False}, "store not open"),
        ({"failed": "disk I/O error"}, "fatal error: disk I/O error"),
        ({"local_handler": None}, "LOCAL grouping handler not known yet"),
        ({"peers": {"n1": False}}, "LOCAL grouping handler n1 not reachable"),
        (
            {"problems": ["two LOCAL grouping handlers: n1, n3"], "local_handler": None},
            "two LOCAL grouping handlers: n1, n3",
        ),
    ],
)
def test_each_reason_for_not_being_ready(changes: dict[str, Any], reason: str) -> None:
    state = assess(**facts(**changes))
    assert not state.ready and state.details["reasons"] == [reason]


def test_the_local_handler_needs_no_link_to_itself() -> None:
    state = assess(**facts(node_id="n1", handler_type="LOCAL", peers={"n2": False}))
    assert state.ready and state.details["role"] == "arbiter"
