"""The WAL's interceptors, declared once, in chain order (Milvus's ``adaptor/builder.go``).

:data:`STAGES` lists every interceptor a framework WAL has, outermost first:
back-pressure -> lock -> dedup -> txn -> segments, then the appender. Each
:class:`Stage` builds its interceptor from the WAL's :class:`StageContext`
(or nothing: the segments stage exists only when the node gives the WAL its
collection hooks) and says whether plain messages (no properties, no
transaction, no DDL) must pass it too. :func:`build` turns the list into
:class:`~.chain.Interceptors`, which finds each interceptor's optional
capabilities (drain, close, chores, tick properties, stats) and calls them in
this order: the WAL never names an interceptor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from headrace import errors
from headrace.message.ids import MessageID
from headrace.tso import TimestampAllocator
from headrace.wal.interceptors.backpressure import BackPressureInterceptor
from headrace.wal.interceptors.chain import Handler, Interceptor, Interceptors
from headrace.wal.interceptors.dedup import DedupInterceptor, DedupWindow
from headrace.wal.interceptors.lock import LockInterceptor
from headrace.wal.interceptors.segments import (
    CollectionHooks,
    SegmentContext,
    SegmentInterceptor,
    SegmentTable,
)
from headrace.wal.interceptors.txn import TxnInterceptor, TxnTable
from headrace.wal.progress import Progress, RetentionOptions


@dataclasses.dataclass(frozen=True, slots=True)
class StageLimits:
    """The WAL options the interceptors apply."""

    max_message_bytes: int
    txn_keepalive_s: float
    max_txn_bytes: int
    max_open_txns: int
    retention: RetentionOptions


@dataclasses.dataclass(frozen=True, slots=True)
class StageContext:
    """What the interceptors of one WAL are built from."""

    pchannel: str
    term: int
    limits: StageLimits
    tso: TimestampAllocator
    progress: Progress
    dedup: DedupWindow
    collections: tuple[CollectionHooks, SegmentTable] | None
    fail: Callable[[errors.HeadraceError], None]
    """Stops the WAL's writing (it is reopened)."""
    last_id: Callable[[], MessageID | None]
    """The WAL's last acknowledged record."""
    monotonic: Callable[[], float]
    wall_clock: Callable[[], float]


@dataclasses.dataclass(frozen=True, slots=True)
class Stage:
    name: str
    build: Callable[[StageContext], Interceptor | None]
    plain: bool = False
    """Plain messages pass it too (the others have nothing to do for them)."""


def _backpressure(ctx: StageContext) -> Interceptor:
    return BackPressureInterceptor(ctx.pchannel, ctx.progress, ctx.limits.retention)


def _lock(ctx: StageContext) -> Interceptor:
    return LockInterceptor()


def _dedup(ctx: StageContext) -> Interceptor:
    return DedupInterceptor(ctx.dedup, ctx.last_id)


def _txn(ctx: StageContext) -> Interceptor:
    limits = ctx.limits
    table = TxnTable(limits.txn_keepalive_s, limits.max_txn_bytes, limits.max_open_txns)
    return TxnInterceptor(table, ctx.tso, limits.max_message_bytes, ctx.monotonic)


def _segments(ctx: StageContext) -> Interceptor | None:
    if ctx.collections is None:
        return None
    hooks, table = ctx.collections
    return SegmentInterceptor(
        table,
        hooks,
        SegmentContext(
            ctx.pchannel,
            ctx.term,
            ctx.limits.max_message_bytes,
            ctx.tso,
            ctx.fail,
            ctx.wall_clock,
            ctx.last_id,
        ),
    )


STAGES: tuple[Stage, ...] = (
    Stage("backpressure", _backpressure),
    Stage("lock", _lock, plain=True),
    Stage("dedup", _dedup),
    Stage("txn", _txn),
    Stage("segments", _segments),
)
"""Every interceptor of a framework WAL, outermost first."""


def build(stages: Sequence[Stage], ctx: StageContext, innermost: Handler) -> Interceptors:
    """The interceptors of ``stages`` built for one WAL, chained around ``innermost``."""
    built = [(stage, stage.build(ctx)) for stage in stages]
    present = [(stage, i) for stage, i in built if i is not None]
    return Interceptors(
        [i for _, i in present], [i for stage, i in present if stage.plain], innermost
    )
