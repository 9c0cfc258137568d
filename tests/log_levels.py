"""What a healthy node must not log: `loud` finds the lines of a node's log (JSON records, as
`log.format: json` writes them) at warning or above, and any line that is no log record."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

# grpc's C core writes lines of its own (`I1125 14:48:43.474836 ... Got goaway`): info is fine.
GRPC_LINE = re.compile(r"^([IWEF])\d{4} ")
QUIET = ("debug", "info")


def loud(lines: Iterable[str]) -> list[str]:
    found = []
    for line in lines:
        grpc_line = GRPC_LINE.match(line)
        if grpc_line:
            if grpc_line.group(1) != "I":
                found.append(line)
            continue
        try:
            level = json.loads(line)["level"]
        except (ValueError, KeyError, TypeError):
            found.append(line)
            continue
        if level not in QUIET:
            found.append(line)
    return found


def stopped(lines: list[str]) -> bool:
    """Whether a node's log ends with its clean stop (a plain node's, or a pair member's)."""
    records = [line for line in lines if line.startswith("{")]
    return bool(records) and json.loads(records[-1])["event"] in STOPPED


STOPPED = ("node stopped", "pair member stopped")
