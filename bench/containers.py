"""The compose cluster (docker-compose.yml) timed, for issue 16: image, `up`, failover gap.

1. Image: `deploy/build-image.sh .venv/bin/python` builds pinmq:bench (PINMQ_IMAGE), warm (the
   base image present) and, with `--cold`, first after the local base `pinmq-base:<release>`
   was removed (the script rebuilds it: debootstrap, about a minute; it stays afterwards).
   Printed: each step's time and the image size.
2. Up, over `--ups` fresh projects: `docker compose up -d --wait` from nothing (no containers,
   network or volumes) to all four healthy; then a whole-stack restart keeping the volumes
   (`down`, then `up -d --wait`). Printed: p50 and max of each.
3. Failover gap, over `--drills` fresh projects, as bench/ha.py's drill: a grouped producer
   sends one persistent message every 10 ms through the pair's published client ports (one
   address list), a consumer reads them through the same list; `docker kill` of node1's
   container. Printed: from the kill (the container's exit, as the engine recorded it) to the
   first send confirmed after it, and to the first message sent after it that the consumer
   received; p50 and max. A drill fails (exit status 1) without either, or when the consumer
   did not receive every confirmed message.

Each project is `pinmq-bench-<random>` (COMPOSE_PROJECT_NAME, and -p) with ephemeral host ports
(tests/compose/ephemeral-ports.yaml), so `make up`'s project `pinmq` and its ports are never
touched; its containers, network and volumes are removed (`down --volumes`) on exit, error,
Ctrl-C or SIGTERM. The image pinmq:bench is kept. Nothing is asserted on timing.

Usage: .venv/bin/python bench/containers.py [--cold] [--no-build] [--ups N] [--drills N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ha import QUEUE, WAIT_S  # the process drill's queue and bound ("orders": in the configs)
from harness.gap import Gap, gap_drill
from harness.procs import run_main

REPO = Path(__file__).resolve().parent.parent
IMAGE = "pinmq:bench"
FILES = ("-f", "docker-compose.yml", "-f", "tests/compose/ephemeral-ports.yaml")
PAIR = ("node1", "node1-backup")
DRAIN_S = 10.0  # after the producer stops: time for the consumer to get what was confirmed
BUILD_WAIT_S = 1200.0


def _env(project: str = "") -> dict[str, str]:
    env = {**os.environ, "DOCKER_CONFIG": str(REPO / ".venv" / "docker"), "PINMQ_IMAGE": IMAGE}
    if project:
        env["COMPOSE_PROJECT_NAME"] = project
    return env


def _run(command: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> str:
    """`command`'s stdout; RuntimeError with its stderr when it fails. In a session of its
    own: Ctrl-C reaches only us (subprocess.run then kills it)."""
    done = subprocess.run(
        command,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: exit {done.returncode}\n{done.stderr.strip()}")
    return done.stdout


@contextlib.contextmanager
def _shielded() -> Iterator[None]:
    """Ctrl-C and SIGTERM ignored meanwhile: a cleanup is not cut short."""
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


class Project:
    """One compose project of our own, ephemeral host ports."""

    def __init__(self) -> None:
        self.name = f"pinmq-bench-{uuid.uuid4().hex[:8]}"
        self.env = _env(self.name)

    def compose(self, *args: str, timeout: float = 300) -> str:
        return _run(["docker", "compose", "-p", self.name, *FILES, *args], self.env, timeout)

    def timed(self, *args: str) -> float:
        """Seconds `docker compose <args>` took."""
        started = time.monotonic()
        try:
            self.compose(*args)
        except RuntimeError as err:
            raise RuntimeError(f"{err}\n{self.logs()}") from None
        return time.monotonic() - started

    def client_address(self, service: str) -> str:
        """The service's published client port: `docker compose port <service> 7601`."""
        return self.compose("port", service, "7601").strip()

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).strip()

    def logs(self, lines: int = 15) -> str:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            status = self.compose("ps", "--all", timeout=60)
            return status + self.compose("logs", "--no-color", "--tail", str(lines), timeout=60)
        return ""

    def down(self) -> None:
        """Containers, network and volumes removed."""
        with _shielded():
            try:
                self.compose("down", "--volumes", "--remove-orphans", "--timeout", "5")
            except (RuntimeError, subprocess.TimeoutExpired) as err:
                print(f"{self.name}: down failed: {err}", file=sys.stderr)


@contextlib.contextmanager
def project() -> Iterator[Project]:
    p = Project()
    try:
        yield p
    finally:
        p.down()


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


# ---- 1. image


def _other_builds() -> list[str]:
    """Other build-image.sh runs (pids): they would share the CPU with ours, and one between
    its base check and its `docker build` fails if we remove the base then."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            args = cmdline.read_bytes().split(b"\0")
            if any(a.endswith(b"build-image.sh") for a in args):
                found.append(cmdline.parent.name)
    return found


def _size_mb(image: str) -> float:
    return int(_run(["docker", "image", "inspect", "-f", "{{.Size}}", image])) / 1e6


def _base() -> str:
    """The local base build-image.sh builds when no registry answers."""
    release = re.search(r"^VERSION_CODENAME=(\S+)", Path("/etc/os-release").read_text(), re.M)
    return f"pinmq-base:{release.group(1) if release else 'bookworm'}"


def _alone() -> None:
    """Wait until no other build-image.sh runs."""
    deadline = time.monotonic() + BUILD_WAIT_S
    while others := _other_builds():
        if time.monotonic() > deadline:
            raise RuntimeError(f"build-image.sh still running elsewhere (pids {others})")
        print(f"waiting for another build-image.sh (pids {others})", file=sys.stderr)
        time.sleep(5)


def _build() -> tuple[float, list[tuple[str, float]], str]:
    """Run build-image.sh for IMAGE: (seconds, each `==>` step with its seconds, its base)."""
    steps: list[tuple[str, float]] = []
    base = ""
    output: list[str] = []
    started = time.monotonic()
    proc = subprocess.Popen(
        ["deploy/build-image.sh", ".venv/bin/python"],
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.monotonic()
            output.append(line)
            print(f"  [{now - started:6.1f} s] {line.rstrip()}", file=sys.stderr)
            if line.startswith("==> "):
                steps.append((line[4:].strip(), now))
                if m := re.match(r"==> image \S+ from (\S+)", line):
                    base = m.group(1)
        rc = proc.wait(BUILD_WAIT_S)
    except BaseException:
        with contextlib.suppress(ProcessLookupError), _shielded():
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        raise
    total = time.monotonic() - started
    if rc != 0:
        raise RuntimeError(f"build-image.sh failed ({rc}):\n{''.join(output[-30:])}")
    ends = [t for _, t in steps[1:]] + [started + total]
    timed = [(what, end - t) for (what, t), end in zip(steps, ends, strict=True)]
    return total, timed, base


def _step(line: str) -> str:
    """A build-image.sh step's short name ('' for a marker that takes no time)."""
    for start, name in (("wheelhouse", "wheelhouse"), ("base image", "base"), ("image", "build")):
        if line.startswith(start):
            return name
    return ""


def _image(cold: bool, build: bool) -> dict[str, str]:
    """Figures of part 1, as table cells."""
    rows: dict[str, str] = {}
    runs = [("cold", True), ("warm", False)] if cold else [("warm", False)]
    if not build:
        runs = [] if _exists(IMAGE) else [("warm", False)]
    for label, remove_base in runs:
        _alone()
        if remove_base:
            base = _base()
            if _exists("python:3.11-slim-bookworm"):
                print("note: the public base is present: the build uses it, not " + base)
            if _exists(base):
                _run(["docker", "image", "rm", base])
                print(f"removed {base} (build-image.sh rebuilds it)", file=sys.stderr)
        print(f"image build, {label} (load {_load()}):", file=sys.stderr)
        total, steps, used = _build()
        detail = ", ".join(f"{_step(what)} {s:.1f} s" for what, s in steps if _step(what))
        print(f"image build, {label}: {total:.1f} s ({detail}); base {used}")
        rows[f"image build, {label}"] = f"{total:.1f} s"
    size = _size_mb(IMAGE)
    base = next(
        (b for b in ("python:3.11-slim-bookworm", _base()) if _exists(b)), "(no base image)"
    )
    base_size = f"{base} {_size_mb(base):.0f} MB" if _exists(base) else base
    print(f"image {IMAGE}: {size:.0f} MB ({base_size})")
    rows["image size"] = f"{size:.0f} MB ({base_size})"
    return rows


def _exists(image: str) -> bool:
    try:
        _run(["docker", "image", "inspect", image], timeout=60)
    except RuntimeError:
        return False
    return True


# ---- 2. up


def _ups(count: int) -> dict[str, list[float]]:
    """Seconds of each: up from nothing, down keeping volumes, up again."""
    times: dict[str, list[float]] = {"up": [], "down": [], "again": []}
    for i in range(count):
        with project() as p:
            up = p.timed("up", "-d", "--wait")
            down = p.timed("down")
            again = p.timed("up", "-d", "--wait")
        for key, value in zip(times, (up, down, again), strict=True):
            times[key].append(value)
        print(
            f"up {i + 1} ({p.name}, load {_load()}): up {up:.1f} s, down {down:.1f} s, "
            f"up again {again:.1f} s",
            file=sys.stderr,
        )
    return times


# ---- 3. failover gap


@dataclass
class Drill:
    """A gap drill (bench/harness/gap.py) with the moments `docker kill` adds."""

    gap: Gap
    send_gap: float = 0.0  # s from the container's exit to the first send confirmed after
    seen_gap: float = 0.0  # ... to the first message sent after it that the consumer got
    kill_cli: float = 0.0  # s the `docker kill` command took
    exit_in_cli: float = 0.0  # s from the command's start to the container's exit


def _finished_at(container: str) -> float:
    """The container's exit, as the engine recorded it (wall clock, s)."""
    stamp = _run(["docker", "inspect", "-f", "{{.State.FinishedAt}}", container]).strip()
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", stamp)).timestamp()


async def _drill(p: Project) -> Drill:
    """bench/ha.py's drill on the containers, timed from the container's exit."""
    url = ",".join(p.client_address(s) for s in PAIR)
    node1 = p.container("node1")
    started: list[float] = []

    async def kill() -> None:
        started.append(time.time())
        await asyncio.to_thread(_run, ["docker", "kill", node1])  # the loop sends meanwhile

    gap = await gap_drill(url, QUEUE, kill, WAIT_S, DRAIN_S)
    drill = Drill(gap, kill_cli=gap.killed_at - started[0])
    exited = await asyncio.to_thread(_finished_at, node1)
    if not started[0] - 1 <= exited <= gap.killed_at + 1:  # another clock: keep ha.py's moment
        print(f"exit time {exited} outside the kill command: using its return", file=sys.stderr)
        exited = gap.killed_at
    drill.exit_in_cli = exited - started[0]
    if gap.first_send is not None and gap.first_seen is not None:
        drill.send_gap, drill.seen_gap = gap.first_send - exited, gap.first_seen - exited
    return drill


def _drills(count: int) -> list[Drill]:
    done = []
    for i in range(count):
        with project() as p:
            p.timed("up", "-d", "--wait")
            drill = asyncio.run(_drill(p))
            if drill.gap.error:
                print(f"drill {i + 1} FAILED: {drill.gap.error}\n{p.logs()}", file=sys.stderr)
        done.append(drill)
        redelivered = sum(1 for n in drill.gap.received.values() if n > 1)
        print(
            f"drill {i + 1} ({p.name}, load {_load()}): send {drill.send_gap * 1000:.0f} ms, "
            f"delivery {drill.seen_gap * 1000:.0f} ms after the exit (docker kill took "
            f"{drill.kill_cli * 1000:.0f} ms, the exit at {drill.exit_in_cli * 1000:.0f} ms "
            f"of it); {len(drill.gap.confirmed)} confirmed, "
            f"{drill.gap.lost} lost, {redelivered} received twice",
            file=sys.stderr,
        )
    return done


# ---- the table


def _row(what: str, values_s: list[float], unit: str = "s") -> str:
    scale, fmt = (1000, "{:.0f} ms") if unit == "ms" else (1, "{:.1f} s")
    p50, top = statistics.median(values_s) * scale, max(values_s) * scale
    return f"| {what} | {fmt.format(p50)} | {fmt.format(top)} | {len(values_s)} |"


def main() -> bool:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="also a build without the base")
    parser.add_argument("--no-build", action="store_true", help=f"use {IMAGE} if present")
    parser.add_argument("--ups", type=int, default=3)
    parser.add_argument("--drills", type=int, default=5)
    args = parser.parse_args()
    if not (REPO / ".venv" / "docker" / "cli-plugins" / "docker-compose").exists():
        sys.exit("no Compose plugin: `make .venv/docker/cli-plugins/docker-compose` links it")
    print(f"load average at start {_load()} on {os.cpu_count()} cores")
    image = _image(args.cold, not args.no_build)
    ups = _ups(args.ups)
    drills = _drills(args.drills)
    print(f"\nload average at the end {_load()}")
    print("| what | p50 | max | n |\n| --- | ---: | ---: | ---: |")
    for what, cell in image.items():
        print(f"| {what} | {cell} | | 1 |")
    if args.ups:
        print(_row("`up -d --wait`, fresh project, to 4 healthy", ups["up"]))
        print(_row("`down` (volumes kept)", ups["down"]))
        print(_row("`up -d --wait` again on the volumes", ups["again"]))
    ok = [d for d in drills if not d.gap.error]
    if ok:
        print(_row("docker kill -> first send confirmed", [d.send_gap for d in ok], "ms"))
        print(_row("docker kill -> first delivery via backup", [d.seen_gap for d in ok], "ms"))
        print(_row("`docker kill` command itself", [d.kill_cli for d in ok], "ms"))
    failed = len(drills) - len(ok)
    if failed:
        print(f"{failed} of {len(drills)} drills FAILED (see above)")
    return not failed


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        run_main(main)
