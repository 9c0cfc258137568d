"""The `pinmq` command line against a real node, run as subprocesses."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

from conftest import PINMQ, cli, node_command, unique

from broker.client import SyncClient


def test_send_and_consume_json(url: str) -> None:
    q = unique()
    sent = cli(
        "send",
        q,
        "--group",
        "g1",
        "--count",
        "3",
        "--body",
        "hello",
        "--header",
        "k=v",
        "--url",
        url,
    )
    assert sent.returncode == 0, sent.stderr
    assert "sent 3 messages" in sent.stdout
    got = cli("consume", q, "--json", "--count", "3", "--url", url)
    assert got.returncode == 0, got.stderr
    lines = [json.loads(line) for line in got.stdout.splitlines()]
    assert [(m["group"], m["group_seq"], m["body"]) for m in lines] == [
        ("g1", 1, "hello"),
        ("g1", 2, "hello"),
        ("g1", 3, "hello"),
    ]
    assert lines[0]["headers"]["k"] == "v"
    assert lines[0]["queue"] == q and lines[0]["delivery_count"] == 1
    assert "\x1b" not in got.stdout, "piped output must not carry progress bars"


def test_send_stdin_auto_group_and_binary_bodies(url: str) -> None:
    q = unique()
    sent = cli("send", q, "--stdin", "--auto-group", "--url", url, stdin="a\nb\nc\n")
    assert sent.returncode == 0, sent.stderr
    with SyncClient(url) as client:
        client.send(q, b"\xff\xfe")
    got = cli("consume", q, "--json", "--timeout", "0.5", "--url", url)
    lines = [json.loads(line) for line in got.stdout.splitlines()]
    assert [m["body"] for m in lines[:3]] == ["a", "b", "c"]
    assert len({m["group"] for m in lines[:3]}) == 1 and lines[0]["group"]
    assert lines[3]["encoding"] == "base64"
    assert base64.b64decode(lines[3]["body"]) == b"\xff\xfe"


def test_queues_groups_and_reset(url: str) -> None:
    q = unique()
    assert (
        cli("send", q, "--group", "gx", "--count", "2", "--body", "x", "--url", url).returncode == 0
    )
    queues = cli("queues", "--url", url)
    assert queues.returncode == 0, queues.stderr
    row = next(line for line in queues.stdout.splitlines() if q in line)
    assert " 2 " in row and "sticky" in row
    groups = cli("groups", q, "--url", url)
    assert groups.returncode == 0 and "gx" in groups.stdout
    reset = cli("reset-groups", q, "--url", url)
    assert reset.returncode == 0 and f"reset all groups of {q}" in reset.stdout
    missing = cli("groups", unique(), "--url", url)
    assert missing.returncode == 1
    assert missing.stderr.startswith(f"pinmq: error: refused by {url}: no queue named")


def test_unreachable_url_is_one_line_error() -> None:
    result = cli("queues", "--url", "127.0.0.1:1")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "pinmq: error: cannot reach a pinmq node at 127.0.0.1:1 (connection refused or timed out)"
    )


def test_bad_config_exits_2_naming_the_file(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("node:\n  id: n1\nlimits:\n  max-message-size: -5\nbogus: 1\n")
    result = subprocess.run(node_command(config), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert str(config) in result.stderr
    assert "max-message-size" in result.stderr and "bogus" in result.stderr
    assert "Traceback" not in result.stderr
    missing = cli("node", "--config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "config file not found" in missing.stderr


def test_usage_errors_exit_2() -> None:
    result = cli("send", "q")  # neither --body nor --stdin
    assert result.returncode == 2
    assert "error: one of the arguments --body --stdin is required" in result.stderr
    result = cli("queues", "--timeout", "0")
    assert result.returncode == 2 and "--timeout: must be > 0, got 0" in result.stderr


def test_wait_returns_once_the_queue_has_its_consumers_and_times_out_loudly(url: str) -> None:
    q = unique()
    with SyncClient(url) as client:
        client.create_queue(q)
    late = cli("wait", q, "--consumers", "1", "--timeout", "0.3", "--url", url)
    assert late.returncode == 1
    assert late.stderr.strip() == (
        f"pinmq: error: timed out after 0.3 s: {q} has 0 of 1 consumers as {url} sees it"
    )
    consumer = subprocess.Popen(
        [*PINMQ, "consume", q, "--timeout", "30", "--url", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ready = cli("wait", q, "--consumers", "1", "--url", url)
        assert ready.returncode == 0, ready.stderr
        assert ready.stdout.strip() == f"{q}: 1 consumer(s)"
    finally:
        consumer.kill()
        consumer.wait()
