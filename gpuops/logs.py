"""Logging setup: JSON lines in a cluster, readable console output on a terminal."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, TextIO, cast

import structlog

from .kube.redact import SECRET_VALUES


def add_format_argument(parser: argparse.ArgumentParser) -> None:
    """`--log-format`: the one logging flag of every command that runs something (sim apiserver, sim up, demo,
    run, agent), so a flag learnt on one works on the others; `json_of(args)` reads it for `configure`."""
    parser.add_argument("--log-format", choices=["json", "console"],
                        help="log format (default: json unless stderr is a terminal)")


def json_of(args: argparse.Namespace) -> bool | None:
    """`configure`'s `json` from the parsed `--log-format` (None, the TTY decides, for commands without it)."""
    log_format: str | None = getattr(args, "log_format", None)
    return None if log_format is None else log_format == "json"


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
    for handler in logging.getLogger().handlers:  # libraries' records (SDKs, aiohttp), tracebacks included
        handler.setFormatter(_ScrubbingFormatter("%(message)s"))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
            _scrub_rendered,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(cast(TextIO, _CurrentStderr())),
        cache_logger_on_first_use=True,
    )


class _CurrentStderr:
    """Whatever `sys.stderr` is when a line is written, not when logging was configured: a host that swaps the
    stream (a test runner capturing output, an embedding application) never leaves logs on a closed file."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _scrub_rendered(_: object, __: str, line: Any) -> str:
    """Last in the chain: the rendered line (exception text included) without any value read from a Secret.
    structlog hands the renderer's output (a str) to the processor after it."""
    return SECRET_VALUES.scrub(str(line))


class _ScrubbingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return SECRET_VALUES.scrub(super().format(record))
