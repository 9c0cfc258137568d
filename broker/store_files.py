"""Which store a node opens (`store.format`, `auto` resolved), where its files lie, and the
refusal to open the other format's files in their place."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from broker.config import NodeConfig
from broker.journal import SUFFIX
from broker.journal_store import JournalStore
from broker.sqlite_file import disk_bytes
from broker.store import Store
from broker.store_base import StoreBase
from broker.store_reads import StoreError

STORE_FILE = "store.db"  # store.format: sqlite
JOURNAL_DIR = "journal"  # store.format: journal


def store_format(config: NodeConfig) -> str:
    """`sqlite` or `journal`: the configured one; for `auto`, sqlite for an ha pair's member
    (only that format is replicated) and for a data directory holding a SQLite store (a node
    upgraded from before the journal), else journal."""
    chosen = config.store.format
    if chosen != "auto":
        return chosen
    if config.ha is not None or disk_bytes(Path(config.node.data_dir) / STORE_FILE):
        return "sqlite"
    return "journal"


def store_path(config: NodeConfig) -> Path:
    """The store's file (sqlite) or directory (journal) in the node's data directory."""
    data_dir = Path(config.node.data_dir)
    return data_dir / (JOURNAL_DIR if store_format(config) == "journal" else STORE_FILE)


def open_store(
    config: NodeConfig, on_full: Callable[[], bool] | None, walk_pages: bool = True
) -> StoreBase:
    """Open the configured store; raises `StoreError` naming the file if it cannot, or if the
    data directory holds messages in the other format (a format is never switched silently:
    its messages would be left behind). `walk_pages`: see `sqlite_file.prepare`."""
    data_dir = Path(config.node.data_dir)
    sqlite_file, journal_dir = data_dir / STORE_FILE, data_dir / JOURNAL_DIR
    if store_format(config) == "journal":
        if disk_bytes(sqlite_file):
            raise StoreError(
                f"{sqlite_file}: store.format is journal but this data directory holds a "
                "sqlite store; start with store.format: sqlite, or empty the directory"
            )
        return JournalStore.open(
            journal_dir, on_full=on_full, segment_bytes=config.store.segment_size
        )
    if journal_dir.is_dir() and any(p.suffix == SUFFIX for p in journal_dir.iterdir()):
        raise StoreError(
            f"{journal_dir}: store.format is sqlite but this data directory holds a journal "
            "store; start with store.format: journal, or empty the directory"
        )
    return Store.open(sqlite_file, on_full=on_full, walk_pages=walk_pages)
