"""Logging setup: JSON lines in a cluster, readable console output on a terminal."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(json: bool | None = None, level: str = "INFO") -> None:
    """json=None picks JSON unless stderr is a terminal (pods have no TTY, developers do)."""
    if json is None:
        json = not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if json
        # plain tracebacks: with `rich` installed the default would print every frame's locals (tokens included)
        else structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)
    )
    logging.basicConfig(level=level, stream=sys.stderr, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
