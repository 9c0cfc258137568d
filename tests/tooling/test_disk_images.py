"""The chaos run's small disks (tests/disk_images.py), real: a loop-mounted ext4 image that a
fill leaves with no room for another megabyte, a free gives back, and that is gone after."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from disk_images import CONTAINER_UID, disks


def test_a_filled_disk_takes_no_more_until_freed_and_is_unmounted_after(tmp_path: Path) -> None:
    with disks(tmp_path, ("node2",), 16) as made:
        disk = made["node2"]
        assert disk.mount.stat().st_uid == CONTAINER_UID and os.path.ismount(disk.mount)
        assert disk.fill() > 10 << 20
        with pytest.raises(OSError) as full, (disk.mount / "store.db").open("wb") as f:
            f.write(b"x" * (1 << 20))
            f.flush()
            os.fsync(f.fileno())
        assert full.value.errno == errno.ENOSPC
        disk.free()
        (disk.mount / "store.db").write_bytes(b"x" * (1 << 20))
    assert not os.path.ismount(disk.mount) and not disk.image.exists()
