"""Flags of retention, truncation and flush back-pressure (``headrace node`` and
``headrace standalone``), building one :class:`RetentionOptions`.

A flag not given keeps the option's default; the standalone forwards the
given ones to its node processes as they were written.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

from headrace.cli.argtypes import non_negative_float, non_negative_int, positive_float, positive_int
from headrace.wal.progress import RetentionOptions


def _or_none(parse: type[int] | type[float]) -> Callable[[str], int | float | None]:
    checked = positive_int if parse is int else positive_float

    def value(text: str) -> int | float | None:
        return None if text.lower() == "none" else checked(text)

    value.__name__ = f"{parse.__name__} or none"
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class _Flag:
    name: str
    option: str
    kind: object
    help: str


FLAGS = (
    _Flag(
        "--retention-s",
        "max_age_s",
        _or_none(float),
        "opaque data may be truncated once older (seconds, or none; default 7 days)",
    ),
    _Flag(
        "--retention-bytes",
        "max_bytes",
        _or_none(int),
        "opaque data may be truncated once this many newer bytes follow (default none)",
    ),
    _Flag(
        "--truncate-margin-s",
        "margin_s",
        non_negative_float,
        "never truncate records younger than this (default 60)",
    ),
    _Flag(
        "--truncate-margin-bytes",
        "margin_bytes",
        non_negative_int,
        "never truncate the newest this many bytes (default 16 MiB)",
    ),
    _Flag(
        "--flush-soft-bytes",
        "soft_bytes",
        positive_int,
        "unflushed bytes past which collection appends slow down (default 1 GiB)",
    ),
    _Flag(
        "--flush-hard-bytes",
        "hard_bytes",
        positive_int,
        "unflushed bytes from which collection appends fail with FLUSH_BEHIND (default 4 GiB)",
    ),
    _Flag(
        "--flush-max-delay-s",
        "max_delay_s",
        non_negative_float,
        "longest slow-down of one append (default 1)",
    ),
    _Flag(
        "--housekeeping-interval-s",
        "pass_interval_s",
        positive_float,
        "seconds between truncation passes (default 10)",
    ),
)


def add_retention_args(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("retention, truncation and flush back-pressure")
    for flag in FLAGS:
        group.add_argument(
            flag.name,
            type=flag.kind,  # type: ignore[arg-type]
            default=argparse.SUPPRESS,
            dest=_dest(flag),
            help=flag.help,
        )


def _dest(flag: _Flag) -> str:
    return flag.name.lstrip("-").replace("-", "_")


def _given(args: argparse.Namespace) -> list[tuple[_Flag, object]]:
    """The flags given (a flag not given is absent from ``args``)."""
    return [(f, getattr(args, _dest(f))) for f in FLAGS if hasattr(args, _dest(f))]


def retention_options(args: argparse.Namespace) -> RetentionOptions:
    """The options the given flags set (InvalidArgument if they contradict)."""
    return RetentionOptions(**{flag.option: value for flag, value in _given(args)})  # type: ignore[arg-type]


def forward_retention_flags(args: argparse.Namespace) -> list[str]:
    """The given retention flags, for a node command line."""
    out: list[str] = []
    for flag, value in _given(args):
        out += [flag.name, "none" if value is None else str(value)]
    return out
