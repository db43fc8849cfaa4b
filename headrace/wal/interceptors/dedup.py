"""Producer deduplication: a retried ``(producer_id, producer_seq)`` is written once.

A message carrying the properties ``producer_id`` and ``producer_seq`` is
remembered with its :class:`AppendResult` once acknowledged; a repeat gets
the original result back without a second write. A repeat that arrives while
the first copy is still being written waits for it, also when the first
caller was cancelled meanwhile (the write goes on, and is remembered). The
window is bounded (oldest pairs forgotten first) and rebuilt from the log's
tail when a new owner opens the WAL (:mod:`headrace.wal.rebuild`), so a retry
after a handoff is not duplicated either.

Record batches (message format 2) are deduplicated the same way, per batch:
the key is ``(producer id, sequence)`` from the batch header (producer id 0:
no dedup), remembered with the batch's :class:`BatchAppendResult`, and
rebuilt from the headers of the batches read back. A retried batch must hold
as many messages as the first copy; another count under the same key is
refused (the producer reused a sequence).
"""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict
from collections.abc import Callable, Mapping

from headrace import errors
from headrace.message.batch import BatchHeader
from headrace.message.ids import MessageID
from headrace.message.properties import PRODUCER_ID, PRODUCER_SEQ
from headrace.message.types import Message
from headrace.wal.api import AppendResult, BatchAppendResult
from headrace.wal.interceptors.chain import AppendContext, Handler

ProducerKey = tuple[str, int]
"""A message's key: its ``producer_id`` and ``producer_seq`` properties."""
BatchKey = tuple[int, int]
"""A record batch's key: its header's producer id and sequence."""
Key = ProducerKey | BatchKey
Remembered = AppendResult | BatchAppendResult
_InFlight = tuple[asyncio.Future[None], AppendContext]

DEDUP_FROM = "dedup_from"
"""Property of the WAL's own ticks and fences: the id a rebuild of the window
starts reading from (:mod:`headrace.wal.rebuild`)."""
"""A key being written: the writing call's done future and the key's context."""


def producer_key(properties: Mapping[str, str]) -> ProducerKey | None:
    """The dedup key of a message, None if it has none; InvalidArgument if malformed."""
    if not properties:
        return None
    pid = properties.get(PRODUCER_ID)
    seq = properties.get(PRODUCER_SEQ)
    if pid is None and seq is None:
        return None
    if not pid or seq is None:
        raise errors.InvalidArgument(
            f"properties {PRODUCER_ID!r} and {PRODUCER_SEQ!r} must be given together "
            "(a non-empty producer id and an integer sequence number)"
        )
    try:
        return pid, int(seq)
    except ValueError:
        raise errors.InvalidArgument(
            f"property {PRODUCER_SEQ!r} must be an integer, got {seq!r}"
        ) from None


def logged_pair(mid: MessageID, msg: Message) -> tuple[ProducerKey, AppendResult] | None:
    """The window's entry for a message read back from the log, None if it has no
    (well-formed) dedup key."""
    try:
        key = producer_key(msg.properties)
    except errors.InvalidArgument:
        return None
    if key is None:
        return None
    return key, AppendResult(mid, msg.timetick, msg.term, msg.txn_id)


def logged_batch_pair(
    record_id: MessageID, header: BatchHeader
) -> tuple[BatchKey, Remembered] | None:
    """The window's entry for a record batch read back from the log (from its
    header alone), None if its producer id is 0."""
    if not header.producer_id:
        return None
    return (header.producer_id, header.sequence), BatchAppendResult(
        record_id, header.count, header.base_timetick, header.term, header.txn_id
    )


def context_key(ctx: AppendContext) -> Key | None:
    """The dedup key of a context: its batch's, else its message's (InvalidArgument
    if a message's is malformed)."""
    part = ctx.batch
    if part is not None:
        key = part.dedup_key
        if key is not None:
            return key
    properties = ctx.message.properties
    return producer_key(properties) if properties else None


def _remembered(ctx: AppendContext, result: AppendResult) -> Remembered:
    part = ctx.batch
    if part is None or not part.header.producer_id:  # no batch key (see BatchPart.dedup_key)
        return result
    return BatchAppendResult.of(result, part.header.count)


def _answer(ctx: AppendContext, known: Remembered) -> None:
    """Settle a repeat of an acknowledged key with the first copy's result."""
    if isinstance(known, AppendResult):
        ctx.result = known
        return
    part = ctx.batch
    count = 1 if part is None else part.header.count
    if count != known.count:
        ctx.fail(
            errors.InvalidArgument(
                f"record batch sequence {known.record_id} was acknowledged for {known.count} "
                f"messages, this batch with the same producer id and sequence holds {count}: "
                "a producer's sequence numbers name one batch each; nothing was written"
            )
        )
        return
    ctx.result = known.first()


class DedupWindow:
    """Bounded memory of acknowledged producer keys, oldest first (messages' and
    record batches' keys, which never collide: a str or an int first)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = max(0, capacity)
        self._acked: OrderedDict[Key, Remembered] = OrderedDict()

    def __len__(self) -> int:
        return len(self._acked)

    @property
    def capacity(self) -> int:
        return self._capacity

    def get(self, key: Key) -> Remembered | None:
        return self._acked.get(key)

    def remember(self, key: Key, result: Remembered) -> None:
        if self._capacity == 0:
            return
        self._acked[key] = result
        self._trim()

    def remember_many(self, pairs: list[tuple[Key, Remembered]]) -> None:
        """:meth:`remember` each pair, in order."""
        if self._capacity == 0 or not pairs:
            return
        self._acked.update(pairs)
        self._trim()

    def _trim(self) -> None:
        acked = self._acked
        while len(acked) > self._capacity:
            acked.popitem(last=False)

    def oldest_id(self) -> MessageID | None:
        """Id of the oldest remembered message: where a rebuild must start."""
        for result in self._acked.values():
            return result.id if isinstance(result, AppendResult) else result.record_id
        return None


class DedupInterceptor:
    def __init__(
        self, window: DedupWindow, last_id: Callable[[], MessageID | None] = lambda: None
    ) -> None:
        """``last_id``: the WAL's last record, where a rebuild starts when the
        window is empty."""
        self.window = window
        self._last_id = last_id
        self._inflight: dict[Key, _InFlight] = {}

    def tick_properties(self) -> dict[str, str]:
        """:data:`DEDUP_FROM`: where a rebuild of the window must start reading."""
        start = self.window.oldest_id() or self._last_id()
        return {DEDUP_FROM: str(start.record_id())} if start is not None else {}

    def _settle(
        self,
        owned: list[tuple[AppendContext, Key]],
        done: asyncio.Future[None] | None,
        write: asyncio.Future[None],
    ) -> None:
        """The write of ``owned`` ended: remember what it acknowledged, release the keys."""
        if not write.cancelled():
            write.exception()  # retrieved here too: its caller may be gone
        inflight = self._inflight
        for _ctx, key in owned:
            del inflight[key]
        self.window.remember_many(
            [(key, _remembered(ctx, ctx.result)) for ctx, key in owned if ctx.result is not None]
        )
        if done is not None:
            done.set_result(None)

    async def __call__(self, batch: list[AppendContext], call_next: Handler) -> None:
        forward: list[AppendContext] = []
        owned: list[tuple[AppendContext, Key]] = []
        waiting: list[tuple[AppendContext, _InFlight]] = []
        window_get, inflight = self.window.get, self._inflight
        done: asyncio.Future[None] | None = None
        for ctx in batch:
            if not ctx.message.properties and ctx.batch is None:
                forward.append(ctx)
                continue
            try:
                key = context_key(ctx)
            except errors.InvalidArgument as exc:
                ctx.fail(exc)
                continue
            if key is None:
                forward.append(ctx)
                continue
            known = window_get(key)
            if known is not None:
                _answer(ctx, known)
                continue
            writing = inflight.get(key)
            if writing is not None:
                waiting.append((ctx, writing))
                continue
            if done is None:
                # One future for every key this call writes: waiters read the
                # writing context's result once it is set.
                done = asyncio.get_running_loop().create_future()
            inflight[key] = (done, ctx)
            owned.append((ctx, key))
            forward.append(ctx)
        if owned:
            # A cancelled caller (a client that gave up on its stream) leaves
            # the write going on, as the appender finishes it: the keys stay
            # in flight until it ends, and its outcome is remembered then, so
            # a retry gets it instead of writing the message a second time.
            write = asyncio.ensure_future(call_next(forward))
            write.add_done_callback(functools.partial(self._settle, owned, done))
            await asyncio.shield(write)
        elif forward:
            await call_next(forward)
        for ctx, (written, writer) in waiting:
            # Shielded: the wait is shared, one waiter leaving must not end it.
            await asyncio.shield(written)
            result = writer.result
            if result is not None:
                _answer(ctx, _remembered(writer, result))
            else:
                ctx.fail(
                    errors.Unavailable(
                        "a concurrent append of the same producer sequence failed; retry"
                    )
                )
