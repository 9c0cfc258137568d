"""Which group a message belongs to: a pure function of a queue's settings and the headers."""

from __future__ import annotations

import zlib

from broker.config import QueueConfig
from broker.message import ALT_GROUP_ID_HEADER, GROUP_ID_HEADER


def group_key(settings: QueueConfig, headers: dict[str, str]) -> str | None:
    """The group a message belongs to under `settings`: header, then default group, then bucket.

    A function of the settings alone, so a clustered node can key a message for a queue that
    lives on another node exactly as that queue will.
    """
    if settings.group_buckets == 0:
        return None
    gid = headers.get(settings.group_header)
    if gid is None and settings.group_header == GROUP_ID_HEADER:
        gid = headers.get(ALT_GROUP_ID_HEADER)
    if not gid:
        gid = settings.default_group
        if gid is None:
            return None
    if settings.group_buckets > 0:
        return f"bucket-{zlib.crc32(gid.encode()) % settings.group_buckets}"
    return gid
