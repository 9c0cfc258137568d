"""The node config's `store` section: which format keeps persistent messages on disk."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from broker.config_base import Strict, size_bytes


class StoreSection(Strict):
    """How the node keeps persistent messages on disk.

    `journal`: an append-only log in segment files under `journal/`, which costs the node less
    CPU per persistent message (bench/RESULTS.md); not for an ha pair yet. `sqlite`: one SQLite
    file, `store.db`, that ops can open with the sqlite3 shell, and the format an ha pair
    replicates. `auto` (the default): sqlite for a member of an ha pair and for a data
    directory that already holds a `store.db`, else journal. A node keeps the format its data
    directory holds: the other one's files are refused, not converted.
    """

    format: Literal["auto", "sqlite", "journal"] = "auto"
    # journal: bytes per segment file; the oldest is deleted (or rolled) once little of it lives
    segment_size: Annotated[int, BeforeValidator(size_bytes), Field(ge=64 * 1024)] = (
        32 * 1024 * 1024
    )
