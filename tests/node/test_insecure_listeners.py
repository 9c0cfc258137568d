"""Secure by default: a node without `tls` serves plain text on loopback only (with one warning
at start), refuses to start when a listener other machines may reach has no TLS, and serves
one unencrypted only when `listen.allow-insecure: true` says so (with one warning)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import NodeProcess, node_command
from ports import reserve_port

from broker.config_file import parse_config
from broker.engine import StartupError
from pinmq.process import check_transport

REFUSAL = (
    "not on loopback and the node has no tls: configure tls, or set listen.allow-insecure: "
    "true to serve unencrypted"
)


def config(listen: dict[str, Any], cluster: bool = False) -> str:
    text = {"node": {"id": "n1"}, "listen": listen}
    if cluster:
        text["cluster"] = {"advertise": "n1:7701"}
    return json.dumps(text)  # JSON is YAML


@pytest.mark.parametrize(
    ("listen", "refused"),
    [
        ({"client": "0.0.0.0:5672"}, "listen.client 0.0.0.0:5672 is " + REFUSAL),
        ({"stomp": "[::]:61613"}, "listen.stomp [::]:61613 is " + REFUSAL),
        ({"http": "10.1.2.3:8161"}, "listen.http 10.1.2.3:8161 is " + REFUSAL),
        ({"client": "broker.example:7601"}, "listen.client broker.example:7601 is " + REFUSAL),
        (
            {"client": "0.0.0.0:7601", "http": "0.0.0.0:8161"},
            "listen.client 0.0.0.0:7601, listen.http 0.0.0.0:8161 are " + REFUSAL,
        ),
    ],
)
def test_a_listener_off_loopback_without_tls_is_refused_in_one_line(
    listen: dict[str, str], refused: str
) -> None:
    with pytest.raises(StartupError) as info:
        check_transport(parse_config(config(listen), "n1.yaml"))
    assert str(info.value) == refused
    allowed = parse_config(config({**listen, "allow-insecure": True}), "n1.yaml")
    check_transport(allowed)  # asked for: served unencrypted


@pytest.mark.parametrize(
    "listen",
    [
        {},  # the defaults: 127.0.0.1
        {"client": "localhost:7601", "stomp": "127.0.0.2:61613", "http": "[::1]:8161"},
        {"cluster": "0.0.0.0:7701"},  # no cluster section: listen.cluster is not bound
    ],
)
def test_loopback_listeners_without_tls_are_allowed(listen: dict[str, str]) -> None:
    check_transport(parse_config(config(listen), "n1.yaml"))


def test_the_cluster_listener_counts_when_the_node_has_a_cluster() -> None:
    with pytest.raises(StartupError, match=r"^listen.cluster 0.0.0.0:7701 is not on loopback"):
        check_transport(parse_config(config({"cluster": "0.0.0.0:7701"}, cluster=True), "n.yaml"))


def warnings(node: NodeProcess) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in node.log().splitlines() if line.startswith("{")]
    return [r for r in records if r["level"] not in ("debug", "info")]


def test_a_node_refuses_to_start_on_a_wildcard_address_without_tls(tmp_path: Path) -> None:
    port = reserve_port()
    node = NodeProcess(tmp_path, {"listen": {"stomp": f"0.0.0.0:{port}"}})
    ended = subprocess.run(
        node_command(node.config_path), capture_output=True, text=True, timeout=60
    )
    assert ended.returncode == 1
    [line] = (ended.stdout + ended.stderr).splitlines()  # one line: the refusal
    record = json.loads(line)
    assert (record["level"], record["event"]) == ("error", "cannot start node")
    assert record["error"] == f"listen.stomp 0.0.0.0:{port} is " + REFUSAL


def test_allow_insecure_serves_a_wildcard_address_with_one_warning(tmp_path: Path) -> None:
    port = reserve_port()
    listen = {"stomp": f"0.0.0.0:{port}", "allow-insecure": True}
    node = NodeProcess(tmp_path, {"listen": listen}).start()
    try:
        assert node.stop() == 0
    finally:
        node.kill()
    [warning] = warnings(node)
    assert warning["event"].startswith("serving unencrypted off loopback")
    assert warning["listeners"] == [f"listen.stomp 0.0.0.0:{port}"]


def test_a_plain_node_on_loopback_warns_once_that_it_is_unencrypted(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path).start()
    try:
        assert node.stop() == 0
    finally:
        node.kill()
    [warning] = warnings(node)
    assert warning["event"] == "serving unencrypted on loopback: no tls"
    assert [entry.split(" ")[0] for entry in warning["listeners"]] == [
        "listen.client",
        "listen.stomp",
        "listen.http",
    ]
