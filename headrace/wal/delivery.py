"""What a scanner delivers, given the log entries in log order (pure logic).

Non-transactional entries pass the reader's filters one by one. Entries of a
transaction are held back and delivered together when its ``COMMIT_TXN`` is
reached (``BEGIN_TXN``, body..., ``COMMIT_TXN``). A transaction is dropped
when its ``ROLLBACK_TXN`` is reached, when a DDL message on its vchannel is
reached (the WAL aborts it then), when a ``FENCE`` of a newer term is reached
(transactions die with their term), or when its ``BEGIN_TXN`` was never seen
(the reader started in its middle).

Filters on a transaction: the vchannel and the timetick bounds apply to the
transaction as a whole (its commit's timetick), the type filter to each
message.
"""

from __future__ import annotations

from collections.abc import Collection

from headrace import errors
from headrace.message.codec import HeaderFilter, Skipped, encoded_size
from headrace.message.types import LogEntry, MessageType
from headrace.wal.api import ReadOptions
from headrace.wal.interceptors.txn import DEFAULT_MAX_TXN_BYTES

TxnKey = tuple[int, int]  # (term, txn_id)


class _Pending:
    __slots__ = ("entries", "size", "vchannel")

    def __init__(self, entry: LogEntry) -> None:
        self.entries = [entry]
        self.vchannel = entry.message.vchannel
        self.size = encoded_size(entry.message)


class Delivery:
    """Turns log entries into the entries a reader should get, in order."""

    def __init__(self, options: ReadOptions, max_txn_bytes: int = DEFAULT_MAX_TXN_BYTES) -> None:
        self._opts = options
        self._vchannels: Collection[str] = frozenset(options.vchannels)
        self._types: Collection[MessageType] = frozenset(options.types)
        self.plain = (  # nothing filtered out: every message without a txn id passes
            not self._vchannels
            and not self._types
            and (options.timetick_gt is None and options.timetick_ge is None)
        )
        self._max_txn_bytes = max_txn_bytes
        self.held: dict[TxnKey, _Pending] = {}
        """Open transactions whose messages are held back (read only, outside)."""
        self.header_filter: HeaderFilter | None = None
        """What a reader may leave undecoded (see :meth:`skip`); None: decode everything."""
        if not self.plain:
            gt, ge = options.timetick_gt, options.timetick_ge
            self.header_filter = HeaderFilter(
                frozenset(self._vchannels),
                frozenset(int(t) for t in self._types),
                max(-1 if gt is None else gt + 1, 0 if ge is None else ge),
            )

    @property
    def open_transactions(self) -> int:
        return len(self.held)

    def oldest_open(self) -> LogEntry | None:
        """The BEGIN_TXN of the oldest transaction held back, if any."""
        for pending in self.held.values():
            return pending.entries[0]
        return None

    def feed(self, entry: LogEntry, out: list[LogEntry]) -> None:
        """Append to ``out`` what becomes deliverable by reaching ``entry``."""
        msg = entry.message
        if msg.txn_id:
            self._feed_txn(entry, out)
            return
        if self.held:
            if msg.type is MessageType.FENCE:
                self._drop_older_terms(msg.term)
            elif msg.type.is_ddl:
                self._drop_vchannel(msg.vchannel)
        if self.plain or self._opts.accepts(msg):
            out.append(entry)

    def skip(self, skipped: Skipped) -> None:
        """Reach a message without a txn id that :attr:`header_filter` rejects.

        It is not delivered (:meth:`feed` would not deliver it either); a
        FENCE or a DDL message still ends the transactions it ends there.
        """
        if self.held:
            if skipped.type is MessageType.FENCE:
                self._drop_older_terms(skipped.term)
            elif skipped.type.is_ddl:
                self._drop_vchannel(skipped.vchannel)

    def _feed_txn(self, entry: LogEntry, out: list[LogEntry]) -> None:
        msg = entry.message
        key = (msg.term, msg.txn_id)
        if msg.type is MessageType.BEGIN_TXN:
            if not self._vchannels or msg.vchannel in self._vchannels:
                self.held[key] = _Pending(entry)
            return
        pending = self.held.get(key)
        if pending is None:
            return
        if msg.type is MessageType.ROLLBACK_TXN:
            del self.held[key]
            return
        if msg.type is MessageType.COMMIT_TXN:
            del self.held[key]
            pending.entries.append(entry)
            if self._group_accepted(entry):
                types = self._types
                out.extend(e for e in pending.entries if not types or e.message.type in types)
            return
        pending.size += encoded_size(msg)
        if pending.size > self._max_txn_bytes:
            raise errors.InvalidArgument(
                f"transaction {msg.txn_id} of term {msg.term} exceeds the reader's limit "
                f"of {self._max_txn_bytes} bytes"
            )
        pending.entries.append(entry)

    def _group_accepted(self, commit: LogEntry) -> bool:
        opts = self._opts
        tt = commit.message.timetick
        if opts.timetick_gt is not None and tt <= opts.timetick_gt:
            return False
        return opts.timetick_ge is None or tt >= opts.timetick_ge

    def _drop_older_terms(self, term: int) -> None:
        for key in [k for k in self.held if k[0] < term]:
            del self.held[key]

    def _drop_vchannel(self, vchannel: str) -> None:
        for key in [k for k, p in self.held.items() if p.vchannel == vchannel]:
            del self.held[key]
