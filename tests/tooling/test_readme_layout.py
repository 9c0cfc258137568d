"""The README's Layout table and its Developing section name what is in the tree.

A table that names a module after it moved sends a newcomer to the wrong place: every path in
the Layout table's first column, and every test folder the Developing section lists, exists.
"""

from __future__ import annotations

import re

from conftest import REPO, TESTS


def _section(title: str) -> str:
    text = (REPO / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_every_path_in_the_layout_table_exists() -> None:
    rows = [line for line in _section("Layout").splitlines() if line.startswith("| `")]
    paths = [p for row in rows for p in re.findall(r"`([^`]+)`", row.split(" | ")[0])]
    assert len(paths) > 20
    missing = [p for p in paths if not (REPO / p.rstrip("/")).exists()]
    assert missing == []


def test_the_test_folders_named_are_the_test_folders() -> None:
    named = set(re.findall(r"`tests/(\w+)`", _section("Developing pinmq")))
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert named == folders
