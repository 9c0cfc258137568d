"""The README's shell blocks, read where the tests that run them as written need them."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_script(heading: str) -> str:
    """The first ```sh block under `## heading`, whole (it may hold a here-document)."""
    section = README.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, f"no sh block under {heading!r}"
    return block.group(1)


def readme_block(heading: str) -> list[str]:
    """The commands of the first ```sh block under `## heading` (comment-only lines dropped)."""
    joined = readme_script(heading).replace("\\\n", " ")
    return [line for line in joined.splitlines() if line.strip() and not line.startswith("#")]
