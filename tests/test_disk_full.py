"""A full data volume never takes a node down: above limits.max-disk-usage persistent sends are
refused with an error naming the limit, consumers drain everything in order even once the
disk is at 100% (the disk reserve gives acks room), sends resume by themselves when space
comes back, and nothing acknowledged is lost across a restart on the full disk.

The data dir is on a small tmpfs mounted for the test (root on these machines) and unmounted
afterwards whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import NodeProcess, get

from broker.client import Client, Full
from broker.message import GROUP_ID_HEADER, GROUP_SEQ_HEADER

VOLUME_MIB = 48
BODY = b"d" * 16 * 1024


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "volume"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={VOLUME_MIB}m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs for the data dir (root needed): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path) -> int:
    """Write a ballast file until the volume has no byte left; its size."""
    written = 0
    chunk = b"\0" * (1 << 16)
    with path.open("wb", buffering=0) as f:
        while True:
            try:
                written += f.write(chunk) or 0
            except OSError:
                break
        with contextlib.suppress(OSError):
            while f.write(b"\0"):
                written += 1
    return written


def resources(node: NodeProcess) -> dict:
    return get(node.http, "/readyz")[1]["resources"]


async def test_a_full_disk_refuses_sends_lets_consumers_drain_and_sends_resume(
    tmp_path: Path, volume: Path
) -> None:
    limits = {"max-disk-usage": 80, "disk-reserve": "2MiB"}
    settings = {"#": {}, "held.#": {"address-full-policy": "BLOCK"}}
    node = NodeProcess(tmp_path, {"limits": limits, "address-settings": settings})
    node.data_dir = volume / "data"
    config = node.config_path.read_text().replace(str(tmp_path / "data"), str(node.data_dir))
    node.config_path.write_text(config)
    node.start()
    try:
        acked: dict[str, list[int]] = defaultdict(list)
        async with Client(node.url) as client:
            await client.create_queue("work")
            await client.create_queue("held.q")
            producer = client.producer("work")
            with pytest.raises(Full, match=r"above limits.max-disk-usage \(80%\)") as refused:
                for i in range(10_000):
                    group, seq = f"g{i % 8}", i // 8 + 1
                    await producer.send(BODY, {GROUP_ID_HEADER: group, GROUP_SEQ_HEADER: str(seq)})
                    acked[group].append(seq)
            sent = sum(map(len, acked.values()))
            assert sent > 1000, refused.value  # about 80% of 48 MiB in 16 KiB messages
            assert resources(node)["disk_full"] is True
            # Under BLOCK a persistent send waits for room instead of failing.
            held = asyncio.create_task(client.producer("held.q").send(b"held"))
            for _ in range(100):
                if resources(node)["blocked_producers"]:
                    break
                await asyncio.sleep(0.05)
            assert resources(node)["blocked_producers"] == 1 and not held.done()

            ballast = volume / "ballast"
            fill(ballast)  # another program takes the rest: the volume is at 100%
            assert os.statvfs(volume).f_bavail == 0
            assert node.proc is not None and node.proc.poll() is None

            got: dict[str, list[int]] = defaultdict(list)
            async with client.consumer("work", prefetch=100) as consumer:
                for _ in range(sent):
                    m = await consumer.receive(timeout=30)
                    assert m is not None, f"{sum(map(len, got.values()))} of {sent} arrived"
                    got[m.group_id or ""].append(m.group_seq)
                    await m.ack()
                assert await consumer.receive(timeout=0.5) is None
            assert got == acked  # every acknowledged message, each group in order
            assert node.proc.poll() is None

            ballast.unlink()
            assert await asyncio.wait_for(held, 30) > 0  # it went in once there was room
            for _ in range(100):  # the node sees the room within a tick or two
                if not resources(node)["disk_full"]:
                    break
                await asyncio.sleep(0.1)
            after = await producer.send(b"after", {GROUP_ID_HEADER: "g0"})
            assert after > 0
        assert node.stop() == 0  # a clean stop on the once-full volume

        fill(volume / "ballast")  # restart on a full disk: it comes up, with the message
        node.start()
        (volume / "ballast").unlink()
        async with Client(node.url) as client, client.consumer("work") as consumer:
            m = await consumer.receive(timeout=10)
            assert m is not None and m.body == b"after"
            await m.ack(wait=True)
        assert node.stop() == 0
    finally:
        node.kill()
    log = node.log()
    assert "fatal error" not in log
    assert "data volume above limits.max-disk-usage" in log
    assert "data volume below limits.max-disk-usage: sends resume" in log
