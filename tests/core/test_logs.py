"""A node's log records reach its stream whole, one write each: grpc's C core writes its own
lines to the same stderr, and a record written in two parts (its text, then its newline) was
once joined to one of those into a line that was neither (a clean stop judged loud)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from broker import logs


class Writes(io.StringIO):
    """A stream that keeps each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


@pytest.fixture
def stream() -> Iterator[Writes]:
    config, handlers = structlog.get_config(), logging.getLogger().handlers[:]
    out = Writes()
    logs.configure("n1", fmt="json", stream=out)
    try:
        yield out
    finally:
        structlog.configure(**config)
        logging.getLogger().handlers = handlers


def test_each_record_is_one_write_ending_its_line(stream: Writes) -> None:
    logs.get("test").info("first", n=1)
    logs.get("test").warning("second")
    logging.getLogger("asyncio").error("a library's record")
    assert len(stream.calls) == 3
    assert all(call.endswith("\n") and call.count("\n") == 1 for call in stream.calls)
    records = [json.loads(call) for call in stream.calls]
    assert [(r["event"], r["level"], r["node"]) for r in records] == [
        ("first", "info", "n1"),
        ("second", "warning", "n1"),
        ("a library's record", "error", "n1"),
    ]
