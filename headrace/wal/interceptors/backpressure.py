"""Back-pressure on unflushed collection data, the chain's outermost stage.

A pchannel that carries collection data keeps every byte after its flush
checkpoint (truncation never passes it), so a flush that falls behind would
grow the log without bound. Past ``soft_bytes`` of unflushed bytes, batches
holding collection data (INSERT and DELETE messages naming a collection) wait
a delay proportional to the excess, at most ``max_delay_s``; from
``hard_bytes`` on, those messages are refused with the retryable FLUSH_BEHIND
before anything is written (the client backs off and retries; nothing
acknowledged is ever dropped). Other messages of the batch go on: seals and
flush requests must pass or the flush could never catch up, and opaque
vchannels are governed by retention instead.

The WAL notes where the opaque records of each acknowledged batch lie
(:func:`note_opaque`): retention holds back only them.

The unflushed bytes and whether the pchannel carries collections come from
the WAL's :class:`~headrace.wal.progress.Progress`, which the owner node's
housekeeping pass updates from the metastore.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence

from headrace import errors
from headrace.message.types import Message, MessageType
from headrace.table.names import COLLECTION
from headrace.wal.api import AppendResult
from headrace.wal.interceptors.chain import AppendContext, Handler
from headrace.wal.interceptors.planning import SYSTEM
from headrace.wal.progress import Progress, RetentionOptions

_DATA = frozenset((MessageType.INSERT, MessageType.DELETE))


@dataclasses.dataclass(frozen=True, slots=True)
class Pressure:
    """What appends of collection data get: a delay, or refusal."""

    delay_s: float = 0.0
    refuse: bool = False


def pressure(unflushed: int, options: RetentionOptions) -> Pressure:
    """The back-pressure for ``unflushed`` bytes (pure)."""
    if unflushed >= options.hard_bytes:
        return Pressure(refuse=True)
    if unflushed <= options.soft_bytes:
        return Pressure()
    excess = (unflushed - options.soft_bytes) / (options.hard_bytes - options.soft_bytes)
    return Pressure(delay_s=min(options.max_delay_s, options.max_delay_s * excess))


def is_collection_data(msg: Message) -> bool:
    return msg.type in _DATA and COLLECTION in msg.properties


def is_opaque(msg: Message) -> bool:
    """A record retention governs: not the WAL's own tick or fence, and of no
    collection (a collection's data, DDL, seals and flushes name it)."""
    return msg.type not in SYSTEM and COLLECTION not in msg.properties


def note_opaque(progress: Progress, batch: Sequence[AppendContext], *, plain: bool) -> None:
    """Note the acknowledged opaque records of ``batch`` in ``progress`` as one
    span (``plain``: every message of the batch is opaque, no properties, and
    the batch went to the log as one request in order: only its ends are
    looked at).

    Timeticks strictly increase with ids along a pchannel's log, so the
    records of the smallest and the largest timetick are the first and the
    last by id, found with integer comparisons only (a dedup hit answers with
    an earlier record's result, anywhere in the batch)."""
    if plain:
        if len(batch) == 1:  # one record batch per call, the common producer append
            only = batch[0].result
            if only is not None:
                progress.opaque_appended(only.id, only.id, only.timetick)
            return
        head = next((ctx.result for ctx in batch if ctx.result is not None), None)
        tail = next((ctx.result for ctx in reversed(batch) if ctx.result is not None), None)
        if head is not None and tail is not None:
            progress.opaque_appended(head.id, tail.id, tail.timetick)
        return
    low: AppendResult | None = None
    high: AppendResult | None = None
    for ctx in batch:
        result = ctx.result
        if result is None:
            continue
        msg = ctx.message
        if msg.type in SYSTEM or COLLECTION in msg.properties:
            continue
        if low is None or result.timetick < low.timetick:
            low = result
        if high is None or result.timetick > high.timetick:
            high = result
    if low is not None and high is not None:
        progress.opaque_appended(low.id, high.id, high.timetick)


class BackPressureInterceptor:
    def __init__(
        self,
        pchannel: str,
        progress: Progress,
        options: RetentionOptions,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.pchannel = pchannel
        self.progress = progress
        self.options = options
        self._sleep = sleep

    async def __call__(self, batch: list[AppendContext], call_next: Handler) -> None:
        progress = self.progress
        if not progress.carries_collections or not any(
            is_collection_data(ctx.message) for ctx in batch
        ):
            await call_next(batch)
            return
        unflushed = progress.unflushed_bytes()
        verdict = pressure(unflushed, self.options)
        if verdict.refuse:
            refusal = self._refusal(unflushed)
            for ctx in batch:
                if is_collection_data(ctx.message):
                    ctx.fail(refusal)
            await call_next([ctx for ctx in batch if not ctx.settled])
            return
        if verdict.delay_s > 0:
            await self._sleep(verdict.delay_s)
        await call_next(batch)

    def _refusal(self, unflushed: int) -> errors.FlushBehind:
        checkpoint = self.progress.flush.checkpoint
        return errors.FlushBehind(
            f"the flush of pchannel {self.pchannel} is behind: {unflushed} bytes after its "
            f"checkpoint ({checkpoint if checkpoint is not None else 'none yet'}) reach the "
            f"hard watermark of {self.options.hard_bytes} bytes; nothing was written, retry "
            "once the flush moves the checkpoint"
        )
