"""Files replaced whole (users files, keys and certificates, development secrets): a reader,
a node re-reading its users file for one, sees the old file or the new one, never part."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from broker.sqlite_file import fsync_dir

PRIVATE = 0o600


def write_atomically(path: Path, data: bytes, mode: int = PRIVATE) -> None:
    """Replace `path` with `data` through a temporary file beside it, synced, then renamed.

    The temporary file is created with `mode` already (a key or a password is never readable
    by others, not even for a moment) and set to exactly `mode` whatever the umask; the rename
    is synced too, so it survives a crash.
    """
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), mode)
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    fsync_dir(path.parent)
