"""The command's exit codes, decided in one place.

* 0: done.
* 1 (:data:`EXIT_ERROR`): something outside the request failed (a node or the
  metastore is unavailable, data is corrupt, ...); the same command may work later.
* 2 (:data:`EXIT_USAGE`): the request itself is wrong (bad flags, an invalid or
  too large message, an unknown pchannel or node, a metastore holding no
  cluster, a data directory or node id that another live process holds, credentials
  the metastore refuses);
  repeating it unchanged cannot succeed.
* 130: interrupted (Ctrl-C); 141: stdout was closed early (``| head``), as
  other command-line tools end on SIGPIPE.
"""

from __future__ import annotations

from collections.abc import Iterable

from headrace import errors

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

INPUT_ERRORS = frozenset(
    {
        errors.ErrorCode.INVALID_ARGUMENT,
        errors.ErrorCode.TOO_LARGE,
        errors.ErrorCode.TRUNCATED,
        errors.ErrorCode.NOT_FOUND,
        errors.ErrorCode.IN_USE,
        errors.ErrorCode.PERMISSION_DENIED,
    }
)
"""Codes that blame the request: retrying it unchanged cannot succeed."""


def exit_code(code: errors.ErrorCode) -> int:
    """The exit code of a command that failed with ``code`` (pure)."""
    return EXIT_USAGE if code in INPUT_ERRORS else EXIT_ERROR


def exit_code_of(failures: Iterable[errors.ErrorCode]) -> int:
    """The exit code of a command whose items failed with ``failures`` (pure):
    0 if none failed, 2 if every failure blames the input, else 1."""
    codes = set(failures)
    if not codes:
        return EXIT_OK
    return EXIT_USAGE if codes <= INPUT_ERRORS else EXIT_ERROR
