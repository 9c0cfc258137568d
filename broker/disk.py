"""The data volume: how full it is, and a reserve of space kept for the day it fills up.

Sends of persistent messages stop at `limits.max-disk-usage`, but other programs share the
volume, and acks, removals and the store's checkpoints need room to be written too: a full
disk must not stop consumers from draining the node. So the node keeps a file of
`limits.disk-reserve` bytes allocated in its data directory and gives it up the moment a
store write finds the disk full; it takes the space again once usage is back under the limit.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

RESERVE_FILE = "disk-reserve"
RESERVE_SHARE = 0.05  # the reserve takes at most this share of the volume


@dataclass(frozen=True, slots=True)
class Usage:
    """Bytes in use and bytes free on a volume, as `df` counts them."""

    used: int
    free: int

    def percent(self) -> float:
        total = self.used + self.free
        return 100.0 * self.used / total if total else 100.0


def usage(directory: Path) -> Usage:
    st = os.statvfs(directory)
    return Usage(used=(st.f_blocks - st.f_bfree) * st.f_frsize, free=st.f_bavail * st.f_frsize)


class Reserve:
    """The reserve file in a data directory: `take` allocates it, `release` gives it back."""

    def __init__(self, directory: Path, size: int) -> None:
        self.path = directory / RESERVE_FILE
        self.size = size

    @property
    def held(self) -> bool:
        return self.path.exists()

    def take(self) -> bool:
        """Allocate the reserve (capped at 5% of the volume); False if there is no room."""
        u = usage(self.path.parent)
        size = min(self.size, int((u.used + u.free) * RESERVE_SHARE))
        if size <= 0:
            return False
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError:
            return False
        try:
            os.posix_fallocate(fd, 0, size)
            os.fsync(fd)
        except OSError:
            os.close(fd)
            self.release()
            return False
        os.close(fd)
        return True

    def release(self) -> bool:
        """Give the space back; True if there was a reserve to give."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        except OSError:
            with contextlib.suppress(OSError):
                os.truncate(self.path, 0)
        return True
