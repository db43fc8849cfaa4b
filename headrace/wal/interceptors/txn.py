"""Transactions on one vchannel.

``BEGIN_TXN`` on vchannel V opens a transaction and gets a new ``txn_id``
(from the TSO, increasing within the WAL's life). Body messages carry that
``txn_id`` and must be on V; ``COMMIT_TXN`` or ``ROLLBACK_TXN`` ends it. A
transaction untouched for ``keepalive`` seconds expires; the WAL then writes
a ``ROLLBACK_TXN`` for it so readers can forget it. A DDL message on V aborts
V's open transactions (readers drop them when they reach the DDL). A
transaction's body is bounded in bytes so readers can buffer it until the
commit. Transactions die with the WAL's term.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from headrace import errors
from headrace.message import codec
from headrace.message.types import Message, MessageType
from headrace.tso import TimestampAllocator
from headrace.wal.interceptors.chain import AppendContext, Handler

DEFAULT_MAX_TXN_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_OPEN_TXNS = 4096
TXN_ID_BYTES = 8
"""What a txn id adds to an encoded message."""
TXN_RELEVANT = frozenset(
    t
    for t in MessageType
    if t.is_ddl or t in (MessageType.BEGIN_TXN, MessageType.COMMIT_TXN, MessageType.ROLLBACK_TXN)
)
"""Types the txn interceptor acts on (besides messages with a txn id)."""


@dataclasses.dataclass(slots=True)
class OpenTxn:
    txn_id: int
    vchannel: str
    last_touch: float
    size: int


class TxnTable:
    """State of the open transactions of one WAL term (pure bookkeeping)."""

    def __init__(self, keepalive_s: float, max_txn_bytes: int, max_open: int) -> None:
        self.keepalive_s = keepalive_s
        self.max_txn_bytes = max_txn_bytes
        self.max_open = max_open
        self._open: dict[int, OpenTxn] = {}
        self._last_id = 0
        self.orphans: list[OpenTxn] = []
        """Abandoned without a logged end (unacknowledged BEGIN_TXN, failed DDL)."""

    def __len__(self) -> int:
        return len(self._open)

    def next_ids(self, first: int, count: int) -> list[int]:
        """``count`` new txn ids from a TSO value, above every earlier one."""
        out = []
        for i in range(count):
            self._last_id = max(first + i, self._last_id + 1)
            out.append(self._last_id)
        return out

    def begin(
        self, txn_id: int, vchannel: str, size: int, now: float
    ) -> errors.HeadraceError | None:
        if len(self._open) >= self.max_open:
            return errors.Unavailable(
                f"too many open transactions on this pchannel ({self.max_open}); "
                "commit or roll back some and retry"
            )
        self._open[txn_id] = OpenTxn(txn_id, vchannel, now, size)
        return None

    def discard(self, txn_id: int) -> None:
        """Forget a transaction whose BEGIN_TXN was not acknowledged.

        It may still have reached the log, so it gets a ROLLBACK_TXN too.
        """
        txn = self._open.pop(txn_id, None)
        if txn is not None:
            self.orphans.append(txn)

    def _live(self, msg: Message, now: float) -> OpenTxn | errors.HeadraceError:
        txn = self._open.get(msg.txn_id)
        if txn is None or now - txn.last_touch > self.keepalive_s:
            return errors.TxnAborted(
                f"transaction {msg.txn_id} is not open: it was committed, rolled back, "
                "expired, aborted by a DDL on its vchannel, or belongs to an earlier "
                "owner of the pchannel; begin a new one"
            )
        if msg.vchannel != txn.vchannel:
            return errors.InvalidArgument(
                f"transaction {msg.txn_id} is on vchannel {txn.vchannel!r}, not {msg.vchannel!r}"
            )
        return txn

    def add_body(self, msg: Message, size: int, now: float) -> errors.HeadraceError | None:
        if msg.type.is_ddl:
            return errors.InvalidArgument("DDL messages cannot be part of a transaction")
        txn = self._live(msg, now)
        if isinstance(txn, errors.HeadraceError):
            return txn
        if txn.size + size > self.max_txn_bytes:
            return errors.InvalidArgument(
                f"transaction {msg.txn_id} would exceed {self.max_txn_bytes} bytes; "
                "commit it and start another"
            )
        txn.size += size
        txn.last_touch = now
        return None

    def end(self, msg: Message, now: float) -> errors.HeadraceError | None:
        """A COMMIT_TXN or ROLLBACK_TXN: the transaction closes now."""
        if msg.txn_id == 0:
            return errors.InvalidArgument(f"{msg.type.name} needs the txn_id of a BEGIN_TXN")
        txn = self._live(msg, now)
        if isinstance(txn, errors.HeadraceError):
            return txn
        del self._open[msg.txn_id]
        return None

    def abort_vchannel(self, vchannel: str) -> list[OpenTxn]:
        gone = [t for t in self._open.values() if t.vchannel == vchannel]
        for txn in gone:
            del self._open[txn.txn_id]
        return gone

    def expire(self, now: float) -> list[OpenTxn]:
        gone = [t for t in self._open.values() if now - t.last_touch > self.keepalive_s]
        for txn in gone:
            del self._open[txn.txn_id]
        return gone

    def expiry_s(self, now: float) -> float | None:
        """Seconds from ``now`` until the oldest open transaction may expire
        (0: orphans wait for their rollback; None: nothing open)."""
        if self.orphans:
            return 0.0
        if not self._open:
            return None
        oldest = min(t.last_touch for t in self._open.values())
        return max(0.0, oldest + self.keepalive_s - now)

    def abort_all(self) -> list[OpenTxn]:
        gone = list(self._open.values())
        self._open.clear()
        return gone


def rollback_message(txn: OpenTxn, reason: str) -> Message:
    """The ROLLBACK_TXN the WAL writes itself for an abandoned transaction."""
    return Message(
        MessageType.ROLLBACK_TXN,
        txn.vchannel,
        properties={"reason": reason},
        txn_id=txn.txn_id,
    )


class TxnInterceptor:
    def __init__(
        self,
        table: TxnTable,
        tso: TimestampAllocator,
        max_message_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table = table
        self._tso = tso
        self._max_bytes = max_message_bytes
        self._clock = clock

    async def __call__(self, batch: list[AppendContext], call_next: Handler) -> None:
        if not any(c.message.txn_id or c.message.type in TXN_RELEVANT for c in batch):
            await call_next(batch)
            return
        n_begin = sum(
            1 for c in batch if c.message.type is MessageType.BEGIN_TXN and not c.message.txn_id
        )
        new_ids = self.table.next_ids(await self._tso.allocate(n_begin), n_begin) if n_begin else []
        # No suspension from here until call_next reaches the appender queue:
        # the table's state changes in the same order as the log.
        now = self._clock()
        forward: list[AppendContext] = []
        begun: list[AppendContext] = []
        ddl: list[tuple[AppendContext, list[OpenTxn]]] = []
        for ctx in batch:
            msg = ctx.message
            if msg.type.is_ddl and not msg.txn_id:
                ddl.append((ctx, self.table.abort_vchannel(msg.vchannel)))
                forward.append(ctx)
                continue
            error = self._decide(ctx, new_ids, now)
            if error is not None:
                ctx.fail(error)
                continue
            forward.append(ctx)
            if ctx.message.type is MessageType.BEGIN_TXN:
                begun.append(ctx)
        try:
            if forward:
                await call_next(forward)
        finally:
            for ctx in begun:
                if ctx.result is None:
                    self.table.discard(ctx.message.txn_id)
            for ctx, aborted in ddl:
                if ctx.result is None:
                    self.table.orphans.extend(aborted)

    def _decide(
        self, ctx: AppendContext, new_ids: list[int], now: float
    ) -> errors.HeadraceError | None:
        msg = ctx.message
        if msg.type is MessageType.BEGIN_TXN:
            if msg.txn_id:
                return errors.InvalidArgument(
                    "BEGIN_TXN must not carry a txn_id; the WAL assigns it"
                )
            txn_id = new_ids.pop(0)
            size = ctx.size + TXN_ID_BYTES
            if size > self._max_bytes:
                return errors.MessageTooLarge(
                    f"BEGIN_TXN of {size} bytes exceeds the maximum of {self._max_bytes} bytes"
                )
            ctx.message = dataclasses.replace(msg, txn_id=txn_id)
            ctx.size = size
            return self.table.begin(txn_id, msg.vchannel, size, now)
        if msg.type in (MessageType.COMMIT_TXN, MessageType.ROLLBACK_TXN):
            return self.table.end(msg, now)
        if msg.txn_id:
            return self.table.add_body(msg, ctx.size, now)
        return None

    def abandoned(self) -> list[Message]:
        """ROLLBACK_TXN messages to write for expired and orphaned transactions."""
        out = [rollback_message(t, "expired") for t in self.table.expire(self._clock())]
        out += [rollback_message(t, "aborted") for t in self.table.orphans]
        self.table.orphans.clear()
        return out

    def abort_all(self) -> list[Message]:
        """ROLLBACK_TXN messages for every open transaction (the WAL stops serving)."""
        return [rollback_message(t, "wal stopped") for t in self.table.abort_all()]

    # -- capabilities (see .chain) -----------------------------------------

    def chore_due_s(self) -> float | None:
        return self.table.expiry_s(self._clock())

    async def chore(self, write: Handler) -> None:
        """Roll back expired and orphaned transactions."""
        await _write_messages(write, self.abandoned())

    async def drain(self, write: Handler) -> None:
        """Roll back every open transaction: the WAL stops serving."""
        await _write_messages(write, self.abort_all())

    def close(self) -> None:
        self.table.abort_all()

    def stats(self) -> dict[str, object]:
        return {"open_txns": len(self.table)}


async def _write_messages(write: Handler, msgs: list[Message]) -> None:
    if msgs:
        await write([AppendContext(m, codec.encoded_size(m)) for m in msgs])
