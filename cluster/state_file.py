"""A small JSON file of failover state (a pair member's, a node's votes), saved whole before
anything that depends on it leaves. A save can fail (a full disk): then nothing that depends
on it may leave, and the state counts as unsaved until a later save succeeds, so whatever
goes out next is on disk first. The failure is warned of once, its end said once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import structlog

from broker import sqlite_file

log = structlog.get_logger(__name__)


class StateFile:
    """One file, written atomically and durably: a crash leaves the old content or the new."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._failing = False

    def read(self) -> Any:
        """What was saved, or None for no file."""
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None

    def save(self, data: Any) -> bool:
        """Whether `data` is on disk now; False (warned of once) if the disk refused it."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with open(tmp, "w") as f:
                json.dump(data, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            sqlite_file.fsync_dir(self.path.parent)
        except OSError as err:
            if not self._failing:
                self._failing = True
                log.warning(
                    "cannot save the failover state: this process sends nothing that depends "
                    "on it (no vote, no heartbeat) until it can",
                    path=str(self.path),
                    error=str(err),
                )
            return False
        if self._failing:
            self._failing = False
            log.info("failover state saved again", path=str(self.path))
        return True
