"""Logging set-up of long-running commands: text or JSON, one event per line.

JSON lines carry ``time``, ``level``, ``logger`` and ``message``, the
exception (``exc_info``) when there is one, and the ``node``, ``pchannel`` and
``term`` fields where they apply. Those come from context variables set with
:func:`bound` around the work they describe: an asyncio task copies the
context it was created in, so the tasks that serve a pchannel at a term log
those fields without every call passing them. ``extra={"pchannel": ...}`` on a
call wins over the context.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import logging
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from pythonjsonlogger.json import JsonFormatter

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONTEXT_FIELDS = ("node", "pchannel", "term")

_node: contextvars.ContextVar[str | None] = contextvars.ContextVar("log_node", default=None)
_pchannel: contextvars.ContextVar[str | None] = contextvars.ContextVar("log_pchannel", default=None)
_term: contextvars.ContextVar[int | None] = contextvars.ContextVar("log_term", default=None)


class LogFormat(enum.StrEnum):
    TEXT = "text"
    JSON = "json"


@contextlib.contextmanager
def bound(
    *, node: str | None = None, pchannel: str | None = None, term: int | None = None
) -> Iterator[None]:
    """Within the block (and in tasks created in it), log records carry the given
    fields; the ones not given keep their outer values."""
    settings: tuple[tuple[contextvars.ContextVar[Any], object], ...] = (
        (_node, node),
        (_pchannel, pchannel),
        (_term, term),
    )
    tokens = [(var, var.set(value)) for var, value in settings if value is not None]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def current() -> dict[str, str | int]:
    """The context fields set here (pure read of the context)."""
    fields: dict[str, str | int] = {}
    for name, var in (("node", _node), ("pchannel", _pchannel), ("term", _term)):
        value = var.get()
        if value is not None:
            fields[name] = value
    return fields


class ContextFilter(logging.Filter):
    """Puts the context fields on each record that has not got them already."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in current().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


def json_formatter() -> logging.Formatter:
    return JsonFormatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        json_ensure_ascii=False,
    )


def configure(level: int, fmt: LogFormat, stream: TextIO | None = None) -> None:
    """Send the root logger's records to ``stream`` (default stderr) in ``fmt``,
    replacing handlers set before (a command configures logging once)."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(
        json_formatter() if fmt is LogFormat.JSON else logging.Formatter(TEXT_FORMAT)
    )
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
