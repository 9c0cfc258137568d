"""Structured logging for a node: JSON lines for machines, a console renderer for people.

Every line carries the node's name, bound once here, so that logs of a cluster can be merged.
Logs go to stderr; nothing on the message hot path logs per message.
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

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            add_node,
            *renderers,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    """A logger for one component of the node (`component` field on every line)."""
    return structlog.get_logger(component=name)
