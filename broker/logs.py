"""Structured logging for a node: JSON lines for machines, a console renderer for people.

Every line carries the node's name, bound once here, so that logs of a cluster can be merged.
Logs go to stderr; nothing on the message hot path logs per message. Records of the standard
library's `logging` (asyncio, grpc, aiohttp) go through the same renderer, so a container's log
is JSON from the first line to the last and a stray error is a line with a level, not loose text.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog

LogFormat = Literal["auto", "json", "console"]


def configure(
    node: str, level: str = "info", fmt: LogFormat = "auto", stream: TextIO | None = None
) -> None:
    """Set up structlog for this process; `auto` picks console on a TTY and JSON otherwise."""
    out = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if out.isatty() else "json"
    renderers: list[structlog.typing.Processor] = (
        [structlog.dev.ConsoleRenderer(colors=out.isatty())]
        if fmt == "console"
        else [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    )

    def add_node(_logger: object, _method: str, event: dict[str, object]) -> dict[str, object]:
        event.setdefault("node", node)
        return event

    stamp: list[structlog.typing.Processor] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_node,
    ]
    threshold = logging.getLevelNamesMapping()[level.upper()]
    # Each record is written whole in one write (PrintLogger's print writes the newline apart):
    # grpc's C core writes its own lines to the same stderr, and one that came between a
    # record and its newline joined the two into a line that was neither.
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, *stamp, *renderers],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.WriteLoggerFactory(out),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *stamp],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderers],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(max(threshold, logging.WARNING))  # libraries' info lines are not ours


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    """A logger for one component of the node (`component` field on every line)."""
    return structlog.get_logger(component=name)
