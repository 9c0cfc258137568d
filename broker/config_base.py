"""The base of every node config section (`broker/config.py`, `broker/config_security.py`)."""

from __future__ import annotations

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
