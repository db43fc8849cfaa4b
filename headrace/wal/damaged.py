"""A pchannel whose log is damaged: readable up to the damage, no appends.

When opening a WAL finds a damaged record in the middle of the log (a bad
CRC, a segment cut short, garbage followed by valid records), nothing may be
appended: the records after the damage are acknowledged data that only an
operator can restore or set aside (``headrace wal repair``). The node keeps
the pchannel as a :class:`DamagedWAL` instead: scanners read the backend from
any position and get every record before the damage, then the CORRUPT error
naming the file and byte offset; appends fail with that error (not
retryable); the node's other pchannels are not affected.
"""

from __future__ import annotations

from collections.abc import Sequence

from headrace import errors
from headrace.message import codec
from headrace.message.ids import MessageID
from headrace.message.types import Message
from headrace.wal.api import AppendResult, BatchAppendResult, ReadOptions, WALState
from headrace.wal.contract import Backend
from headrace.wal.scanner import DEFAULT_READ_BATCH, Scanner


class DamagedWAL:
    """The read-only stand-in for the WAL of ``pchannel`` at ``term``."""

    def __init__(
        self,
        backend: Backend,
        pchannel: str,
        term: int,
        damage: errors.CorruptData,
        *,
        read_batch: int = DEFAULT_READ_BATCH,
    ) -> None:
        self._backend = backend
        self._pchannel = pchannel
        self._term = term
        self.damage = damage
        self._read_batch = read_batch
        self._closed = False
        self._refusal = errors.CorruptData(
            f"pchannel {pchannel} takes no appends, its log is damaged: {damage.message}",
            path=damage.path,
            offset=damage.offset,
        )

    @property
    def pchannel(self) -> str:
        return self._pchannel

    @property
    def term(self) -> int:
        return self._term

    @property
    def state(self) -> WALState:
        return WALState.CLOSED if self._closed else WALState.CORRUPT

    @property
    def last_timetick(self) -> int:
        return 0

    @property
    def last_id(self) -> MessageID | None:
        return None

    @property
    def message_format(self) -> int:
        """What producers are told to send (a damaged log takes nothing)."""
        return codec.FORMAT_VERSION

    @property
    def max_batch_bytes(self) -> int:
        return 0

    async def append_many(
        self, msgs: Sequence[Message]
    ) -> list[AppendResult | errors.HeadraceError]:
        return [self._refusal] * len(msgs)

    async def append_batches(
        self, batches: Sequence[bytes]
    ) -> list[BatchAppendResult | errors.HeadraceError]:
        return [self._refusal] * len(batches)

    def read(self, options: ReadOptions) -> Scanner:
        if self._closed:
            raise errors.NotOwner(
                f"the damaged log of {self._pchannel} (term {self._term}) is no longer hosted "
                "here; find the current owner and retry",
                term=self._term,
            )
        return Scanner(self._backend, self._pchannel, options, None, batch_size=self._read_batch)

    async def drain(self) -> None:
        return None

    async def close(self) -> None:
        self._closed = True

    def stats(self) -> dict[str, object]:
        return damage_stats(self.state, self._term, self.damage)


def damage_stats(state: WALState, term: int, damage: errors.CorruptData) -> dict[str, object]:
    """What ListWALs reports of a damaged log (pure)."""
    return {
        "state": state.value,
        "term": term,
        "error": str(damage),
        "retryable": "false",
        "corrupt_file": damage.path,
        "corrupt_offset": damage.offset,
    }
