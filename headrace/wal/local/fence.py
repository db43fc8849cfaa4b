"""The identity of a local WAL writer, and how a new open takes the fence (pure).

A term alone does not tell writers apart: two processes can open one pchannel
under the same term (a duplicated node id, a paused process whose pchannel was
handed to a new process of its id). So every open gets its own identity, a
:class:`Fence` of the term and an *epoch*: a per-pchannel counter that every
open raises by one, whatever its term (like the producer epoch Kafka bumps for
each ``initTransactions`` of one transactional id). Identities are unique and
ordered: a later open always has a greater one.

The term file stores the identity of the newest open. A writer acknowledges a
write only while the stored identity is still its own, so the second of two
same-term writers fences the first exactly as a higher term does. Segments
carry the identity of the writer that created them (format 2: the name's
``seq`` is the writer's epoch), which decides the head of the chain.

Term file layout (little endian): format 2 is 20 bytes, term (8), epoch (8),
CRC-32 of those 16 bytes (4); format 1 (written before identities) is 12
bytes, term (8) and its CRC-32, read as epoch 0.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from headrace import errors

MAX_EPOCH = (1 << 32) - 1
"""Epochs are stored as a segment's 32-bit ``seq``."""
_V1 = struct.Struct("<QI")
_V2 = struct.Struct("<QQI")
ENCODED_SIZE = _V2.size


class Fence(NamedTuple):
    """A writer's identity: its term, then the epoch of its open (ordered)."""

    term: int
    epoch: int

    def describe(self) -> str:
        return f"term {self.term} (writer epoch {self.epoch})"


NO_FENCE = Fence(0, 0)
"""Stored before any writer opened."""


def claim(stored: Fence, term: int, epoch_floor: int, pchannel: str) -> Fence:
    """The identity of a new open under ``term`` (pure).

    Fenced if a higher term is stored. The epoch exceeds the stored one and
    ``epoch_floor`` (the highest epoch seen on a segment, so a lost or older
    term file cannot hand out an identity twice).
    """
    if term < stored.term:
        raise errors.Fenced(
            f"pchannel {pchannel}: term {term} is older than the stored term {stored.term}",
            term=term,
            current_term=stored.term,
        )
    epoch = max(stored.epoch, epoch_floor) + 1
    if epoch > MAX_EPOCH:
        raise errors.HeadraceError(
            f"pchannel {pchannel}: every writer epoch up to {MAX_EPOCH} was used; "
            "copy the pchannel's data to a new pchannel"
        )
    return Fence(term, epoch)


def fenced_error(pchannel: str, own: Fence, stored: Fence, what: str) -> errors.Fenced:
    """The error of a writer ``own`` that finds ``stored`` in the term file."""
    return errors.Fenced(
        f"pchannel {pchannel}: writer of {own.describe()} was fenced by {stored.describe()}; "
        f"{what}",
        term=own.term,
        current_term=stored.term,
    )


def encode(fence: Fence) -> bytes:
    raw = struct.pack("<QQ", fence.term, fence.epoch)
    return raw + struct.pack("<I", zlib.crc32(raw))


def decode(data: bytes, path: str) -> Fence:
    """The identity stored in a term file's bytes (empty: :data:`NO_FENCE`)."""
    if not data:
        return NO_FENCE
    if len(data) == _V1.size:
        term, crc = _V1.unpack(data)
        if zlib.crc32(data[:8]) != crc:
            raise errors.CorruptData(f"{path}: CRC mismatch at byte offset 0")
        return Fence(term, 0)
    if len(data) != _V2.size:
        raise errors.CorruptData(
            f"{path}: expected {_V2.size} (or {_V1.size}) bytes, found {len(data)}"
        )
    term, epoch, crc = _V2.unpack(data)
    if zlib.crc32(data[:16]) != crc:
        raise errors.CorruptData(f"{path}: CRC mismatch at byte offset 0")
    return Fence(term, epoch)
