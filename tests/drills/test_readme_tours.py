"""The README's two tours, run as written against a `make up` cluster, every claim checked.

The cluster is `pinmq up` over the shipped `deploy/node{1,1-backup,2,3}.yaml`, unchanged. Their
fixed ports (7601-7603, ...) are free because the nodes and the tours run in a private network
namespace (`unshare --net`): a developer's own `make up` or a second test run never clashes.
The command blocks are parsed from README.md, not copied; a marker line is printed before each
command, so every command's output is checked against what the block's comments claim. The
nodes speak TLS and want a user, as `make up`'s do: they run where secrets/ is the
repository's (the development secrets of `make secrets`), and the tours, which start with
`source secrets/client.env`, run from the repository root as a user's would.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import PINMQ, REPO
from deploy_access import SECRETS, dev_access
from readme_blocks import readme_block, readme_script

pytestmark = pytest.mark.slow  # the tours take 40 s and more: a module fixture, for all of them

MARK = "@@@ tour line "
SCRATCH = "@@@ tour scratch "
HINT = "@@@ up hint"
RUN_TIMEOUT_S = 240
# What the test tools write into the repository root: other tests, run alongside (xdist), may
# create these while the tours run (a hypothesis test its example database, say).
TOOL_CACHES = frozenset({".hypothesis", ".pytest_cache", ".ruff_cache", "__pycache__"})


@dataclass
class Tour:
    """A tour's commands, each with what it printed, and the scratch directory it wrote in."""

    commands: list[str]
    outputs: list[str]
    errors: list[str]  # what each command wrote to stderr (background jobs' lines may mix in)
    scratch: Path

    def output(self, prefix: str, nth: int = 0) -> str:
        """What the nth command starting with `prefix` printed."""
        return self.outputs[self._index(prefix, nth)]

    def error(self, prefix: str, nth: int = 0) -> str:
        """What the nth command starting with `prefix` wrote to stderr: why it printed nothing."""
        return self.errors[self._index(prefix, nth)]

    def _index(self, prefix: str, nth: int) -> int:
        found = [i for i, c in enumerate(self.commands) if c.startswith(prefix)]
        assert len(found) > nth, f"no command {prefix!r} (#{nth}) in {self.commands}"
        return found[nth]

    def jsonl(self, name: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.scratch / name).read_text().splitlines()]


@dataclass
class Tours:
    hint: str  # what the example printed by `pinmq up` printed
    cluster: Tour
    one_node: Tour
    stomp: Tour
    left_in_repo: list[str]  # names that appeared in the repository root while they ran


def table(text: str, which: int = 0) -> list[dict[str, str]]:
    """The rows of the `which`th table printed by the CLI (rich's box drawing), by column name."""
    lines = text.splitlines()
    tops = [i for i, line in enumerate(lines) if line.startswith("┏")]
    lines = lines[tops[which] :]
    lines = lines[: next(i for i, line in enumerate(lines) if line.startswith("└")) + 1]
    header = next(line for line in lines if line.startswith("┃"))
    names = [cell.strip() for cell in header.strip("┃").split("┃")]
    rows = [line for line in lines if line.startswith("│")]
    return [
        dict(zip(names, (c.strip() for c in r.strip("│").split("│")), strict=True)) for r in rows
    ]


def tour_script(commands: list[str], index: int) -> str:
    """The block in a subshell from the repository root, a marker before every command."""
    lines = [f"( cd {shlex.quote(str(REPO))}"]
    for i, command in enumerate(commands):
        lines.append(f"printf '\\n{MARK}{index}.{i}\\n' | tee /dev/stderr")
        lines.append(command)
    lines.append(f"printf '\\n{SCRATCH}{index} %s\\n' \"$PWD\"")
    lines.append(")")
    return "\n".join(lines)


def split_outputs(out: str, index: int, count: int) -> list[str]:
    parts = re.split(rf"\n{re.escape(MARK)}(\d+)\.(\d+)\n", "\n" + out)
    outputs = [""] * count
    for i in range(1, len(parts), 3):
        if int(parts[i]) == index:
            outputs[int(parts[i + 1])] = parts[i + 2].split(f"\n{SCRATCH}", 1)[0]
    return outputs


@pytest.fixture(scope="module")
def tours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tours]:
    """Start the cluster, run both tours in order as a user would, stop the cluster."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail("unshare and ip (util-linux, iproute2) are needed: see tests/prerequisites.py")
    dev_access()  # secrets/ made now, not while the tours run (they check the repository)
    work = tmp_path_factory.mktemp("tour")
    shutil.copytree(REPO / "deploy", work / "deploy")
    (work / "secrets").symlink_to(SECRETS)  # where the configs name them, from `pinmq up`'s cwd
    (work / "tmp").mkdir()
    names = ("node1", "node1-backup", "node2", "node3")  # as `make up` starts them
    configs = [str(work / "deploy" / f"{name}.yaml") for name in names]
    blocks = [
        readme_block("A cluster tour"),
        readme_block("Groups on one node"),
        [readme_script("STOMP")],  # one command: its Python is a here-document
    ]
    pinmq = PINMQ
    up = shlex.join([*pinmq, "up", *configs, "--run-dir", str(work / "run")])
    down = shlex.join([*pinmq, "down", "--run-dir", str(work / "run")])
    script = "\n".join(
        [
            "ip link set lo up",
            f"cd {shlex.quote(str(work))}",
            f"{up} > up.out || {{ cat up.out; exit 97; }}",
            f"printf '{HINT}\\n'",
            "eval \"$(sed -n 's/^try: //p' up.out)\"",  # the example `pinmq up` prints
            *(tour_script(commands, i) for i, commands in enumerate(blocks)),
            f"cd {shlex.quote(str(work))} && {down}",
        ]
    )
    before = {p.name for p in REPO.iterdir()} | TOOL_CACHES
    env = {
        **os.environ,
        "TMPDIR": str(work / "tmp"),  # where `mktemp -d` puts each tour's scratch directory
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
    }
    env.pop("PINMQ_URL", None)
    try:
        done = subprocess.run(
            ["unshare", "--net", "--map-root-user", "bash", "-c", script],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
    finally:
        subprocess.run([*pinmq, "down", "--run-dir", str(work / "run")], capture_output=True)
    logs = "\n".join(
        f"==== {p.name}\n{p.read_text()[-3000:]}" for p in (work / "run").glob("*.log")
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}\n{logs}"
    scratch = dict(re.findall(rf"^{re.escape(SCRATCH)}(\d+) (.*)$", done.stdout, re.M))
    assert len(scratch) == len(blocks), f"a tour ended elsewhere:\n{done.stdout}"
    cluster, one_node, stomp = (
        Tour(
            commands,
            split_outputs(done.stdout, i, len(commands)),
            split_outputs(done.stderr, i, len(commands)),
            Path(scratch[str(i)]),
        )
        for i, commands in enumerate(blocks)
    )
    hint = done.stdout.split(f"{HINT}\n", 1)[1].split(f"\n{MARK}", 1)[0]
    yield Tours(hint, cluster, one_node, stomp, sorted({p.name for p in REPO.iterdir()} - before))


def test_the_example_printed_by_up_sends_and_consumes_a_group(tours: Tours) -> None:
    got = [json.loads(line) for line in tours.hint.splitlines() if line.startswith("{")]
    assert [(m["group"], m["group_seq"], m["body"]) for m in got] == [
        ("g1", seq, "hi") for seq in range(1, 6)
    ]


def test_the_cluster_tour_binds_alice_to_node3_and_delivers_every_message_in_order(
    tours: Tours,
) -> None:
    tour = tours.cluster
    assert tour.output("pinmq wait orders --consumers 1").strip() == "orders: 1 consumer(s)"
    for via in ("7601", "7602"):
        assert "sent 5 messages to orders in group alice" in tour.output(
            f"pinmq send orders --url 127.0.0.1:{via}"
        )
    alice = [row for row in table(tour.output("pinmq groups --cluster")) if row["group"] == "alice"]
    assert len(alice) == 1, alice
    assert alice[0]["queue@node"] == "orders@node3" and alice[0]["bound"] == "yes"
    assert alice[0]["owner"].startswith("on-node3 (")
    reset = tour.output("pinmq reset-groups --cluster --group alice").strip()
    assert reset == "unbound group alice cluster-wide (1 binding(s) removed)"
    status = tour.output("pinmq status --cluster")
    assert re.search(
        r"ha node1: active process node1, epoch \d+, backup node1-backup in sync", status
    )
    assert {row["node"] for row in table(status)} == {"node1", "node2", "node3"}

    got = tour.jsonl("node3.jsonl")
    assert [m["group"] for m in got] == ["alice"] * 10
    for via in ("via node1", "via node2"):  # each sender's order; they forward independently
        assert [m["group_seq"] for m in got if m["body"] == via] == [1, 2, 3, 4, 5]
    lines = (tour.scratch / "node3.jsonl").read_text().splitlines()
    printed = tour.output("wait; cut -c1-100 node3.jsonl").strip("\n").splitlines()
    assert printed == [line[:100] for line in lines]


def test_the_one_node_tour_gives_each_worker_one_group_in_order(
    tours: Tours,
) -> None:
    tour = tours.one_node
    tasks = [row for row in table(tour.output("pinmq queues")) if row["queue"] == "tasks"]
    assert len(tasks) == 1 and tasks[0]["depth"] == "30" and tasks[0]["consumers"] == "0"
    pending = {row["group"]: row for row in table(tour.output("pinmq groups tasks", 0))}
    assert set(pending) == {"alice", "bob", "carol"}
    assert all(row["owner"] == "-" and row["pending"] == "10" for row in pending.values())

    assert tour.output("pinmq wait tasks --consumers 3").strip() == "tasks: 3 consumer(s)"
    listing = tour.output("pinmq groups tasks", 1)
    pinned = {row["group"]: row["owner"].split(" ")[0] for row in table(listing)}
    consumers = table(listing, 1)
    assert sorted(row["consumer"].split(" ")[0] for row in consumers) == ["c1", "c2", "c3"]
    assert all(row["stalled"] == "-" and row["groups"] == "1" for row in consumers), consumers
    assert set(pinned) == {"alice", "bob", "carol"}
    assert sorted(pinned.values()) == ["c1", "c2", "c3"], pinned  # one group each
    reset = tour.output("pinmq reset-groups tasks").strip()
    assert reset == "reset group alice of tasks", tour.error("pinmq reset-groups tasks")

    expected = {
        "alice": [("task for alice", s) for s in range(1, 11)]
        + [("more for alice", s) for s in range(1, 6)],
        "bob": [("task for bob", s) for s in range(1, 11)],
        "carol": [("task for carol", s) for s in range(1, 11)],
    }
    for group, owner in pinned.items():
        got = tour.jsonl(f"{owner}.jsonl")
        assert {m["group"] for m in got} == {group}, f"{owner} got {[m['group'] for m in got]}"
        assert [(m["body"], m["group_seq"]) for m in got] == expected[group]
    first = (tour.scratch / "c1.jsonl").read_bytes()[:300].decode()
    assert first and tour.output("head -c 300 c1.jsonl").strip() == first.strip()


def test_the_tours_write_nothing_into_the_repository(tours: Tours) -> None:
    assert tours.left_in_repo == []


def test_the_stomp_example_logs_in_over_tls_and_its_message_arrives(tours: Tours) -> None:
    [got] = [json.loads(line) for line in tours.stomp.outputs[0].splitlines() if line[:1] == "{"]
    assert (got["group"], got["group_seq"], got["body"]) == ("dave", 1, "order 1")
