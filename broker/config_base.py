"""The base of every node config section (`broker/config.py`, `broker/config_security.py`,
`broker/config_store.py`): strict kebab-case sections, match patterns, sizes in bytes."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

from broker import wildcard


def kebab(name: str) -> str:
    return name.replace("_", "-")


class Strict(BaseModel):
    """Base for every config section: kebab-case keys, unknown keys rejected, immutable."""

    model_config = ConfigDict(
        alias_generator=kebab, populate_by_name=True, extra="forbid", frozen=True
    )


def check_pattern(pattern: str) -> None:
    """An address match pattern (address-settings, security roles) must be well formed."""
    if not pattern or wildcard.is_wildcard_word_misuse(pattern):
        raise PydanticCustomError(
            "pinmq",
            f"bad match pattern {pattern!r}: expected words separated by '.', "
            "with '#' and '*' only as whole words",
        )


_SIZE = re.compile(r"^\s*(\d+)\s*(B|KB|KiB|MB|MiB|GB|GiB)?\s*$")
_UNITS = {None: 1, "B": 1, "KB": 1000, "KiB": 1 << 10, "MB": 1000**2, "MiB": 1 << 20}
_UNITS |= {"GB": 1000**3, "GiB": 1 << 30}


def size_bytes(value: Any) -> Any:
    """A byte count: an integer, or a string such as `64MiB` (B, KB, KiB, MB, MiB, GB, GiB)."""
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match is None:
            raise ValueError("a size in bytes such as 67108864 or 64MiB")
        return int(match[1]) * _UNITS[match[2]]
    return value
