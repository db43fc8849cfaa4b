"""The framework WAL: one pchannel, one owner term, on top of a backend.

``WAL.open`` fences older terms in the backend, recovers the last timetick and
id, rebuilds the dedup window from the log's tail, writes a FENCE above every
timetick in the log, and serves. Appends are validated
(:mod:`.validation`), then pass the interceptors declared in
:data:`.interceptors.stages.STAGES` (back-pressure -> lock -> dedup -> txn ->
segments) to the appender, which group-commits to the backend and feeds the
write-ahead buffer that tail readers use. The segments stage (collections:
schema checks, growing segments, seals, :mod:`.interceptors.segments`) is
there when the node gives the WAL its :class:`CollectionHooks`; without them
every message is opaque. Drain, close, chores, tick properties and stats go
to the interceptors through their capabilities (:mod:`.interceptors.chain`),
in the declared order. Ticks and chores run only while something is pending,
woken by the node's :class:`~headrace.wal.ticks.TickScheduler`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Mapping, Sequence

from headrace import errors
from headrace.message import batch, codec, records
from headrace.message.batch import Limits
from headrace.message.formats import RELEASE_FORMATS, FormatSupport, write_refusal
from headrace.message.ids import MessageID
from headrace.message.types import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Message,
    MessageType,
)
from headrace.tso import TimestampAllocator
from headrace.wal.api import (
    AppendResult,
    BatchAppendResult,
    ReadOptions,
    WALState,
)
from headrace.wal.buffer import START, Position, WriteAheadBuffer
from headrace.wal.contract import Backend, BackendWriter, Record, where
from headrace.wal.damaged import damage_stats
from headrace.wal.interceptors import stages
from headrace.wal.interceptors.backpressure import note_opaque
from headrace.wal.interceptors.chain import (
    AppendContext,
    BatchPart,
    representative,
    whole_part,
)
from headrace.wal.interceptors.dedup import DedupWindow
from headrace.wal.interceptors.planning import BATCH_OVERHEAD
from headrace.wal.interceptors.segments import (
    CollectionHooks,
    SegmentInterceptor,
    SegmentPolicy,
    SegmentTable,
    scan_start,
)
from headrace.wal.interceptors.timetick import Appender, AppenderConfig, TimetickSync
from headrace.wal.interceptors.txn import (
    DEFAULT_MAX_OPEN_TXNS,
    DEFAULT_MAX_TXN_BYTES,
)
from headrace.wal.progress import OpaqueSpan, Progress, RetentionOptions, widened_start
from headrace.wal.rebuild import History, TailScan, rebuild, replay_from
from headrace.wal.scanner import DEFAULT_READ_BATCH, Scanner, open_backend_scanner
from headrace.wal.ticks import TickScheduler
from headrace.wal.validation import CheckedBatch, Validator, validate

__all__ = ["WAL", "Scanner", "WALOptions", "open_backend_scanner", "validate"]

_STAT_DEFAULTS: dict[str, object] = {"open_txns": 0, "growing_segments": 0}
"""Stats every WAL reports, whichever interceptors it has (they report their own)."""


@dataclasses.dataclass(frozen=True)
class WALOptions:
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    timetick_interval_ms: float = 10.0
    buffer_bytes: int = 64 * 1024 * 1024
    max_batch_messages: int = 1024
    """Messages per backend append."""
    txn_keepalive_s: float = 10.0
    dedup_window: int = 100_000
    """Remembered ``(producer, seq)`` pairs."""
    max_txn_bytes: int = DEFAULT_MAX_TXN_BYTES
    max_open_txns: int = DEFAULT_MAX_OPEN_TXNS
    read_batch: int = DEFAULT_READ_BATCH
    """Entries a scanner reads ahead at most."""
    retention: RetentionOptions = dataclasses.field(default_factory=RetentionOptions)
    """Retention, truncation margin, back-pressure watermarks (applied by the
    owner node's housekeeping pass and the back-pressure interceptor)."""
    open_timeout_s: float | None = None
    """Bound of :meth:`WAL.open` (fencing, the dedup rebuild, the FENCE): past
    it the open fails with ``Unavailable`` and is retried, it never hangs.
    None: see :func:`open_timeout`."""
    segments: SegmentPolicy = dataclasses.field(default_factory=SegmentPolicy)
    """When growing segments of collections are sealed."""
    message_format: int = codec.FORMAT_VERSION
    """The message format the WAL writes: the cluster's format version, which
    a node checks it can write before it opens the WAL
    (:mod:`headrace.message.formats`). Format 2 stores record batches
    (:meth:`WAL.append_batches`)."""
    max_batch_bytes: int | None = None
    """Largest record batch a producer may append (one backend record); None:
    ``max_message_bytes`` plus what a batch of one message adds to it, so a
    batch is never larger than the largest message stored alone."""
    release_formats: FormatSupport = RELEASE_FORMATS
    """What the release running the WAL can write (a node passes its own)."""

    @property
    def batch_limits(self) -> Limits:
        """The bounds of a producer's record batch."""
        most = self.max_batch_bytes
        return Limits(
            self.max_message_bytes,
            self.max_message_bytes + BATCH_OVERHEAD if most is None else most,
        )

    def __post_init__(self) -> None:
        minimums: dict[str, float] = {
            "max_message_bytes": codec.HEADER_SIZE + 4,
            "buffer_bytes": 1,
            "max_batch_messages": 1,
            "dedup_window": 0,
            "max_txn_bytes": 1,
            "max_open_txns": 1,
            "read_batch": 1,
        }
        refusal = write_refusal(self.release_formats, self.message_format)
        if refusal:
            raise errors.InvalidArgument(f"WAL option message_format: {refusal}")
        if self.max_batch_bytes is not None and (
            isinstance(self.max_batch_bytes, bool)
            or not isinstance(self.max_batch_bytes, int)
            or self.max_batch_bytes < batch.HEADER_SIZE + batch.RECORD_HEADER_SIZE
        ):
            raise errors.InvalidArgument(
                f"WAL option max_batch_bytes must be None or an integer of at least "
                f"{batch.HEADER_SIZE + batch.RECORD_HEADER_SIZE}, got {self.max_batch_bytes!r}"
            )
        for name, least in minimums.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise errors.InvalidArgument(
                    f"WAL option {name} must be an integer of at least {least}, got {value!r}"
                )
        for name in ("timetick_interval_ms", "txn_keepalive_s", "open_timeout_s"):
            value = getattr(self, name)
            if value is None and name == "open_timeout_s":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise errors.InvalidArgument(
                    f"WAL option {name} must be a positive number, got {value!r}"
                )


DEFAULT_OPEN_TIMEOUT_S = 60.0
"""Bound of an open on a backend that states no operation timeout (local, memory)."""
OPEN_TIMEOUT_FACTOR = 4
"""An open makes a handful of sequential backend calls, each bounded by the
backend's ``operation_timeout_s``; the whole open gets this many of them."""


def open_timeout(options: WALOptions, description: Mapping[str, object]) -> float:
    """The bound of an open (pure): ``options.open_timeout_s`` if set, else
    :data:`OPEN_TIMEOUT_FACTOR` times the operation timeout the backend's
    ``describe()`` states, else :data:`DEFAULT_OPEN_TIMEOUT_S`."""
    if options.open_timeout_s is not None:
        return options.open_timeout_s
    stated = description.get("operation_timeout_s")
    if isinstance(stated, bool) or not isinstance(stated, int | float) or stated <= 0:
        return DEFAULT_OPEN_TIMEOUT_S
    return float(stated) * OPEN_TIMEOUT_FACTOR


class WAL:
    """The write-ahead log of one pchannel under one owner term."""

    def __init__(
        self,
        *,
        backend: Backend,
        pchannel: str,
        term: int,
        tso: TimestampAllocator,
        options: WALOptions,
        writer: BackendWriter,
        last: Position,
        dedup: DedupWindow,
        collections: tuple[CollectionHooks, SegmentTable] | None = None,
        scheduler: TickScheduler | None = None,
    ) -> None:
        """``scheduler``: the node's timer loop for its WALs' ticks and chores
        (None: the WAL runs its own)."""
        self.pchannel = pchannel
        self.term = term
        self._backend = backend
        self._opts = options
        self._writer = writer
        self._state = WALState.OPENING
        self._buffer = WriteAheadBuffer(options.buffer_bytes, last)
        self._dedup = dedup
        self._appender = Appender(
            AppenderConfig(
                pchannel,
                term,
                max(1, options.max_batch_messages),
                options.max_message_bytes,
                self._tick_properties,
                self._last_record,
                options.message_format,
            ),
            writer,
            tso,
            self._buffer,
            last,
        )
        self._interceptors = stages.build(
            stages.STAGES,
            stages.StageContext(
                pchannel,
                term,
                stages.StageLimits(
                    options.max_message_bytes,
                    options.txn_keepalive_s,
                    options.max_txn_bytes,
                    options.max_open_txns,
                    options.retention,
                ),
                tso,
                self.progress,
                dedup,
                collections,
                self._appender.fail,
                lambda: self._appender.last_id,
                time.monotonic,
                time.time,
            ),
            self._appender.write,
        )
        self._segments = next(
            (i for i in self._interceptors.all if isinstance(i, SegmentInterceptor)), None
        )
        """The segments stage, if the WAL has collections (tests look at its table)."""
        self._owns_scheduler = scheduler is None
        self._sync = TimetickSync(
            self._appender,
            self._buffer,
            self._interceptors,
            write=self._write_system,
            interval_s=options.timetick_interval_ms / 1000.0,
            scheduler=TickScheduler(pchannel) if scheduler is None else scheduler,
            serving=lambda: self._state is WALState.SERVING,
        )
        self._validator = Validator(
            options.max_message_bytes, options.batch_limits, collections=collections is not None
        )
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._lifecycle = asyncio.Lock()
        self.damage: errors.CorruptData | None = None
        """A damaged record a reader found in the log: the WAL takes no more
        appends (they would land behind records no reader can pass)."""

    # -- lifecycle ---------------------------------------------------------

    @classmethod
    async def open(
        cls,
        backend: Backend,
        pchannel: str,
        term: int,
        *,
        tso: TimestampAllocator,
        options: WALOptions = WALOptions(),
        collections: CollectionHooks | None = None,
        scheduler: TickScheduler | None = None,
    ) -> WAL:
        """Open ``pchannel`` at ``term`` within :func:`open_timeout`.

        ``collections``: the node's lookups for collection messages; the
        growing segments are rebuilt from its checkpoint. ``scheduler``: the
        node's timer loop for the ticks and chores of its WALs (None: the WAL
        runs its own)."""
        bound = open_timeout(options, backend.describe())
        try:
            async with asyncio.timeout(bound):
                return await cls._open(
                    backend,
                    pchannel,
                    term,
                    tso,
                    options,
                    collections=collections,
                    scheduler=scheduler,
                )
        except TimeoutError:
            raise errors.Unavailable(
                f"opening the WAL of {pchannel} at term {term} did not finish within "
                f"{bound:g} s ({where(backend)}); retry"
            ) from None

    @classmethod
    async def _open(
        cls,
        backend: Backend,
        pchannel: str,
        term: int,
        tso: TimestampAllocator,
        options: WALOptions,
        *,
        collections: CollectionHooks | None,
        scheduler: TickScheduler | None,
    ) -> WAL:
        writer = await backend.open_writer_for(pchannel, term, options.message_format)
        wal: WAL | None = None
        try:
            last_record = await backend.last_record(pchannel)
            last = START
            history: History | None = None
            unread: list[OpaqueSpan] = []
            dedup = DedupWindow(options.dedup_window)
            segments = None if collections is None else SegmentTable(options.segments)
            if last_record is not None:
                last_id, last_msg = records.last_entry(last_record.id, last_record.data)
                last = Position(last_id, last_msg.timetick)
                scan = None
                summary = None
                if collections is not None and segments is not None:
                    summary = await collections.opaque_summary(pchannel)
                    start = scan_start(await collections.checkpoint(pchannel), last_msg)
                    read_from = widened_start(start, summary)
                    history = History(read_from, replay_from(start, segments.replay_record))
                    scan = TailScan(read_from, history.observe)
                await rebuild(backend, pchannel, last_record, last_msg, dedup, scan=scan)
                unread = (
                    History.unread(last)
                    if history is None
                    else history.spans(last, await backend.earliest(pchannel), summary)
                )
            wal = cls(
                backend=backend,
                pchannel=pchannel,
                term=term,
                tso=tso,
                options=options,
                writer=writer,
                last=last,
                dedup=dedup,
                collections=None
                if collections is None or segments is None
                else (collections, segments),
                scheduler=scheduler,
            )
            wal.progress.opaque.note_history(unread)
            wal._appender.start()
            await wal._appender.fence()
        except BaseException:
            if wal is not None:
                await wal._appender.abort()
            with contextlib.suppress(errors.HeadraceError):
                await writer.close()
            raise
        wal._state = WALState.SERVING
        wal._sync.start()
        return wal

    async def drain(self) -> None:
        """Stop taking appends, finish in-flight ones, write a final TIME_TICK."""
        async with self._lifecycle:
            await self._drain()

    async def _drain(self) -> None:
        if self._state is not WALState.SERVING:
            return
        self._state = WALState.DRAINING
        await self._sync.stop()
        await self._idle.wait()
        await self._interceptors.drain(self._write_system)
        try:
            await self._appender.tick(sync=False)
        except errors.HeadraceError:
            self._mark_failed()
        await self._appender.stop()

    async def close(self) -> None:
        """Drain if serving, then release the backend writer; idempotent."""
        async with self._lifecycle:
            await self._close()

    async def _close(self) -> None:
        if self._state is WALState.CLOSED:
            return
        if self._state is WALState.SERVING:
            await self._drain()
        await self._sync.stop()
        if self._owns_scheduler:
            await self._sync.scheduler.close()
        await self._appender.abort()
        self._interceptors.close()
        self._buffer.close()
        self._state = WALState.CLOSED
        try:
            await self._writer.close()
        except errors.HeadraceError:
            return

    # -- appends -----------------------------------------------------------

    async def append(self, msg: Message) -> AppendResult:
        result = (await self.append_many([msg]))[0]
        if isinstance(result, errors.HeadraceError):
            raise result
        return result

    async def append_many(
        self, msgs: Sequence[Message]
    ) -> list[AppendResult | errors.HeadraceError]:
        """One result per message, in order; a bad message does not fail the others."""
        refusal = self._refusal()
        if refusal is not None:
            return [refusal] * len(msgs)
        check = self._validator.check
        contexts: list[AppendContext] = []
        valid: list[AppendContext] = []
        plain = True
        for msg in msgs:
            checked = check(msg)
            if isinstance(checked, errors.HeadraceError):
                ctx = AppendContext(msg, 0, error=checked)
            else:
                ctx = AppendContext(msg, checked[0])
                plain = plain and checked[1]
                valid.append(ctx)
            contexts.append(ctx)
        # Only the stages declared for them see plain messages.
        await self._run_chain(valid, plain=plain)
        return [_outcome(ctx) for ctx in contexts]

    async def append_batches(
        self, batches: Sequence[bytes]
    ) -> list[BatchAppendResult | errors.HeadraceError]:
        """Append producers' record batches (message format 2, unstamped); one
        result per batch, in order; a bad batch does not fail the others.

        Each batch is checked as a whole (:meth:`Validator.check_batch`). A
        batch holding no DDL, transaction control or collection message
        passes the interceptors as one context and is stored as one record
        with one timetick; any other must hold that one message, which takes
        the per-message path (its result is then that message's). Batches
        are deduplicated by their producer id and sequence."""
        refusal = self._refusal() or self._batch_refusal()
        if refusal is not None:
            return [refusal] * len(batches)
        contexts: list[AppendContext] = []
        valid: list[AppendContext] = []
        plain = quiet = True
        checks = self._validator.check_batches(batches)
        for data, checked in zip(batches, checks, strict=True):
            if checked.__class__ is CheckedBatch and checked.whole:
                # The common batch, inline (per batch: most are one message
                # when a call spreads over many vchannels).
                header = checked.header
                ctx = AppendContext(
                    representative(header, checked.first_type),
                    header.length,
                    None,
                    None,
                    whole_part(header, data),
                )
                contexts.append(ctx)
                valid.append(ctx)
                if header.txn_id:
                    quiet = plain = False
                elif header.producer_id:
                    plain = False
                continue
            ctx = self._batch_context(data, checked)
            contexts.append(ctx)
            if ctx.error is None:
                valid.append(ctx)
                # Whole batches outside transactions touch no transaction and no
                # segment: they make no chore due.
                quiet = (
                    quiet
                    and isinstance(checked, CheckedBatch)
                    and checked.whole
                    and not checked.header.txn_id
                )
                plain = (
                    plain
                    and quiet
                    and isinstance(checked, CheckedBatch)
                    and not checked.header.producer_id
                )
        await self._run_chain(valid, plain=plain, chores=not quiet)
        return [_batch_outcome(ctx) for ctx in contexts]

    def _batch_refusal(self) -> errors.HeadraceError | None:
        if self._opts.message_format == batch.FORMAT_VERSION:
            return None
        return errors.InvalidArgument(
            f"the WAL of pchannel {self.pchannel} writes message format "
            f"{self._opts.message_format}, not record batches (message format "
            f"{batch.FORMAT_VERSION}); send messages one by one, or switch the cluster to "
            f"format {batch.FORMAT_VERSION} first (`headrace format set {batch.FORMAT_VERSION}`)"
        )

    def _batch_context(
        self, data: bytes, checked: CheckedBatch | errors.HeadraceError
    ) -> AppendContext:
        """The context of one producer batch: the whole batch, or its one message
        (checked as a message: the per-message path)."""
        if isinstance(checked, errors.HeadraceError):
            return AppendContext(_NO_MESSAGE, 0, error=checked)
        header = checked.header
        if checked.whole:
            return AppendContext(
                representative(header, checked.first_type),
                header.length,
                batch=whole_part(header, data),
            )
        (msg,) = batch.messages(data, header)
        outcome = self._validator.check(msg)
        if isinstance(outcome, errors.HeadraceError):
            return AppendContext(msg, 0, error=outcome)
        return AppendContext(msg, outcome[0], batch=BatchPart(header))

    async def _run_chain(
        self, valid: list[AppendContext], *, plain: bool, chores: bool | None = None
    ) -> None:
        """Pass ``valid`` through the interceptors (only the plain stages if
        ``plain``) to the log; ``chores``: the appends may make a chore due (a
        transaction or a segment; default: unless ``plain``)."""
        interceptors = self._interceptors
        chain = interceptors.plain_chain if plain else interceptors.chain
        self._inflight += 1
        self._idle.clear()
        try:
            await chain(valid)
            note_opaque(self.progress, valid, plain=plain)
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()
            if chores if chores is not None else not plain:
                self._sync.attention()  # a transaction or segment may have a chore due
        if self._appender.failure is not None:
            self._mark_failed()

    def _refusal(self) -> errors.HeadraceError | None:
        state = self._state
        damage = self.damage
        if state is WALState.SERVING and damage is not None:
            return errors.CorruptData(
                f"pchannel {self.pchannel} takes no appends, its log is damaged: {damage.message}",
                path=damage.path,
                offset=damage.offset,
            )
        if state is WALState.SERVING:
            return None
        if state is WALState.UNAVAILABLE and self._appender.failure is not None:
            return self._appender.failure
        return errors.NotOwner(
            f"the WAL of pchannel {self.pchannel} (term {self.term}) is {state.value}; "
            "find the current owner and retry",
            term=self.term,
        )

    # -- reads -------------------------------------------------------------

    def read(self, options: ReadOptions) -> Scanner:
        return Scanner(
            self._backend,
            self.pchannel,
            options,
            self._buffer,
            batch_size=self._opts.read_batch,
            max_txn_bytes=self._opts.max_txn_bytes,
            on_corrupt=self._note_damage,
        )

    def _note_damage(self, damage: errors.CorruptData) -> None:
        if self.damage is None and self._state is WALState.SERVING:
            self.damage = damage

    # -- state -------------------------------------------------------------

    @property
    def state(self) -> WALState:
        if self._state is WALState.SERVING and self._appender.failure is not None:
            self._mark_failed()
        if self._state is WALState.SERVING and self.damage is not None:
            return WALState.CORRUPT
        return self._state

    @property
    def last_timetick(self) -> int:
        return self._appender.last_timetick

    @property
    def message_format(self) -> int:
        """The message format the WAL writes (2: it takes record batches)."""
        return self._opts.message_format

    @property
    def max_batch_bytes(self) -> int:
        """Largest record batch :meth:`append_batches` takes."""
        return self._opts.batch_limits.max_batch_bytes

    @property
    def progress(self) -> Progress:
        """Bytes appended, sampled positions and the flush state (retention)."""
        return self._appender.progress

    @property
    def last_id(self) -> MessageID | None:
        return self._appender.last_id

    def stats(self) -> dict[str, object]:
        last_id = self._appender.last_id
        if self.damage is not None:
            damaged = damage_stats(self.state, self.term, self.damage)
            return {"last_id": str(last_id) if last_id is not None else "", **damaged}
        return {
            "last_id": str(last_id) if last_id is not None else "",
            "last_timetick": self._appender.last_timetick,
            "buffer_bytes": self._buffer.size_bytes,
            "buffer_entries": self._buffer.size_entries,
            "state": self.state.value,
            "term": self.term,
            "appended_total": self._appender.appended_total,
            "idle": self._state is WALState.SERVING and self._sync.idle,
            **_STAT_DEFAULTS,
            **self._interceptors.stats(),
        }

    # -- internals ---------------------------------------------------------

    def _mark_failed(self) -> None:
        if self._state in (WALState.SERVING, WALState.DRAINING):
            self._state = WALState.UNAVAILABLE
            self._buffer.close()

    def _tick_properties(self) -> dict[str, str]:
        return self._interceptors.tick_properties()

    async def _last_record(self) -> Record | None:
        return await self._backend.last_record(self.pchannel)

    async def _write_system(self, batch: list[AppendContext]) -> None:
        """Write what the WAL's interceptors write themselves (rollbacks, seals)."""
        await self._appender.write(batch)
        note_opaque(self.progress, batch, plain=False)


_NO_MESSAGE = Message(MessageType.INSERT)
"""The message of a context refused before it had one (a malformed batch)."""


def _batch_outcome(ctx: AppendContext) -> BatchAppendResult | errors.HeadraceError:
    result = ctx.result
    if result is None:
        return ctx.error or errors.HeadraceError("append was not settled by the interceptor chain")
    part = ctx.batch
    return BatchAppendResult.of(
        result, 1 if part is None or part.data is None else part.header.count
    )


def _outcome(ctx: AppendContext) -> AppendResult | errors.HeadraceError:
    if ctx.result is not None:
        return ctx.result
    if ctx.error is not None:
        return ctx.error
    return errors.HeadraceError("append was not settled by the interceptor chain")
