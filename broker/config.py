"""Node configuration: the YAML contract, validated with pydantic.

Only the queue settings live here so far; the rest of the node config is built around them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


def kebab(name: str) -> str:
    return name.replace("_", "-")


class Strict(BaseModel):
    """Base for every config section: kebab-case keys, unknown keys rejected, immutable."""

    model_config = ConfigDict(
        alias_generator=kebab, populate_by_name=True, extra="forbid", frozen=True
    )


class QueueConfig(Strict):
    """Group semantics of one queue (Artemis address-settings / queue attributes)."""

    durable: bool = True
    group_header: str = "JMSXGroupID"
    group_mode: Literal["sticky", "shared"] = "sticky"
    group_buckets: int = Field(default=-1, ge=-1)
    group_rebalance: bool = False
    group_rebalance_pause_dispatch: bool = False
    group_first_key: str | None = None
    default_group: str | None = None
    max_delivery_attempts: int = Field(default=10, ge=1)
    dead_letter_address: str | None = "DLQ"
    consumers_before_dispatch: int = Field(default=0, ge=0)
    delay_before_dispatch: int = Field(default=-1, ge=-1)

    @field_validator("group_header")
    @classmethod
    def _header_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be a non-empty header name")
        return value
