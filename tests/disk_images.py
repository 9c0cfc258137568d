"""Small disks of their own for the chaos run's containers: a file-backed ext4 image per
service, loop-mounted on the host and bind-mounted as the service's data directory, so the
nemesis can fill one node's disk to its limit and free it without touching the host's own
disk. Needs root on the host (mount); every disk is unmounted and its image removed at the
end, pass or fail.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

CONTAINER_UID = 10001  # deploy/Dockerfile's pinmq user: the node writes its data as that user
STEP = 1 << 20


class Disk:
    """One mounted image; `fill` takes every free byte, `free` gives them back."""

    def __init__(self, image: Path, mount: Path, megabytes: int) -> None:
        self.image, self.mount = image, mount
        image.parent.mkdir(parents=True, exist_ok=True)
        with image.open("wb") as f:
            f.truncate(megabytes << 20)
        _run("mkfs.ext4", "-q", "-m", "0", "-F", str(image))  # no blocks kept for root
        mount.mkdir(parents=True, exist_ok=True)
        _run("mount", "-o", "loop", str(image), str(mount))
        os.chown(mount, CONTAINER_UID, CONTAINER_UID)
        self._filler = mount / "chaos-fill"

    def fill(self) -> int:
        """Take all the free room (bytes taken): the node's next writes find the disk full."""
        with self._filler.open("ab") as f:
            room = os.fstatvfs(f.fileno())
            size = room.f_bavail * room.f_frsize
            while size > 0:
                try:
                    os.posix_fallocate(f.fileno(), f.seek(0, os.SEEK_END), size)
                except OSError as err:
                    if err.errno != errno.ENOSPC:
                        raise
                    size -= STEP  # metadata took a little of what statvfs counted
                    continue
                break
            return f.seek(0, os.SEEK_END)

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)

    def close(self) -> None:
        # Lazy: a container's mount namespace may let go of it a moment after it is removed.
        subprocess.run(["umount", "-l", str(self.mount)], capture_output=True, check=False)
        self.image.unlink(missing_ok=True)


def _run(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{' '.join(command)}: {done.stderr}"


@contextlib.contextmanager
def disks(workdir: Path, services: tuple[str, ...], megabytes: int) -> Iterator[dict[str, Disk]]:
    """A disk for each service under `workdir/disks`, removed on the way out."""
    made: dict[str, Disk] = {}
    try:
        for name in services:
            where = workdir / "disks"
            made[name] = Disk(where / f"{name}.img", where / name, megabytes)
        yield made
    finally:
        for disk in made.values():
            disk.close()
