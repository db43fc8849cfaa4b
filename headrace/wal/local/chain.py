"""Which segments form a pchannel's log, and how much of each is readable.

Every segment names the one it continues (its predecessor) and the valid byte
length ``prev_len`` its creator measured there after storing its identity.
The log is the chain that ends in the segment of the newest writer identity
(term, then epoch: see :mod:`.fence`), then the highest LSN: walking back
through the predecessors gives the segments in order, each readable up to its
successor's ``prev_len``. Segments off that chain were created by writers
fenced before they wrote anything and are ignored, as are bytes a fenced
writer added past a measured length. Ordering by identity rather than by term
alone keeps a fenced writer of the same term (which may still roll into a new,
empty segment) from ever becoming the head.

A segment whose header cannot be read is placed by its file name (base LSN,
writer identity). If it is on the chain (a readable segment names it as its
predecessor) or would be its head, the chain is *broken* there: it holds the
segments before it, the last one read up to the damaged segment's base LSN,
and whoever reads past them gets the damage (file, offset 0) as CorruptData,
like a damaged record. Headers are written whole under a temporary name and
linked into place (:func:`.files.create_segment`), so a crash never leaves a
torn header: a damaged one is always damage, never a torn tail. A damaged
segment off the chain (below the head and named by no successor) is ignored
like any other segment off the chain.

A chain is *trusted* when its head was created by the stored identity, read
after listing the segments; otherwise a new owner has stored its identity but
not yet created its segment, and readers wait for it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from headrace import errors
from headrace.wal.local.fence import Fence
from headrace.wal.local.segment import HEADER_SIZE, SegmentHeader, SegmentName


@dataclasses.dataclass(frozen=True, slots=True)
class Link:
    header: SegmentHeader
    path: str
    limit: int | None
    """Readable byte length; None for the head (read to its last valid record)."""
    end_lsn: int | None
    """LSN of the successor's first record; None for the head."""

    @property
    def name(self) -> SegmentName:
        return self.header.name

    @property
    def base_lsn(self) -> int:
        return self.header.name.base_lsn


@dataclasses.dataclass(frozen=True, slots=True)
class Chain:
    links: tuple[Link, ...]
    fence: Fence
    """The stored writer identity, read after listing the segments."""
    marker: int
    """First LSN still readable according to the truncation marker."""
    broken: errors.CorruptData | None = None
    """Damage of the segment that follows the links (its header cannot be read)."""

    @property
    def head(self) -> Link | None:
        """The newest segment; CorruptData if the chain is broken (its head is unknown)."""
        if self.broken is not None:
            raise self.broken
        return self.links[-1] if self.links else None

    @property
    def trusted(self) -> bool:
        return (
            self.broken is not None or not self.links or self.links[-1].header.fence >= self.fence
        )

    @property
    def first_lsn(self) -> int:
        """Lowest LSN that can still be read (if it exists)."""
        if not self.links:
            return self.marker
        return max(self.marker, self.links[0].base_lsn)

    def index_of(self, lsn: int) -> int:
        """Index of the link holding ``lsn`` (the head for LSNs past the end)."""
        for index, link in enumerate(self.links):
            if link.end_lsn is None or lsn < link.end_lsn:
                return index
        if self.broken is not None:
            raise self.broken
        raise errors.CorruptData("segment chain has no head")  # links always end in a head

    def position_of(self, name: SegmentName) -> int | None:
        for index, link in enumerate(self.links):
            if link.name == name:
                return index
        return None


def name_key(name: SegmentName) -> tuple[int, int, int, int]:
    """The :attr:`~.segment.SegmentHeader.head_key` of a segment whose header
    cannot be read, from its name read as the current format writes it."""
    return (name.term, name.seq, name.base_lsn, name.seq)


def build_chain(
    directory: str,
    headers: Mapping[SegmentName, SegmentHeader],
    fence: Fence,
    marker: int,
    damaged: Mapping[SegmentName, errors.CorruptData] | None = None,
) -> Chain:
    """The chain of ``headers`` (all segments listed), ending in the head.

    ``damaged``: the listed segments whose header cannot be read. If the chain
    meets one, it ends before it: the last link is bounded by the damaged
    segment's base LSN (``limit`` still None: the caller measures it) and
    :attr:`Chain.broken` holds the damage.
    """
    damaged = damaged or {}
    links, met = _walk(directory, headers)
    head_key = links[-1].header.head_key if links else None
    if met is None or met not in damaged:
        newer = [n for n in damaged if head_key is None or name_key(n) > head_key]
        if not newer:
            return Chain(links, fence, marker)
        met = max(newer, key=name_key)
    bad_key = name_key(met)
    before = build_chain(
        directory,
        {n: h for n, h in headers.items() if h.head_key < bad_key and n.base_lsn <= met.base_lsn},
        fence,
        marker,
        {n: exc for n, exc in damaged.items() if name_key(n) < bad_key},
    )
    if before.broken is not None:
        return before
    kept = before.links
    if kept:
        kept = (*kept[:-1], dataclasses.replace(kept[-1], end_lsn=met.base_lsn))
    return Chain(kept, fence, marker, damaged[met])


def _walk(
    directory: str, headers: Mapping[SegmentName, SegmentHeader]
) -> tuple[tuple[Link, ...], SegmentName | None]:
    """The links back from the head of ``headers``, and the predecessor the
    walk stopped at for lack of its header (None if the first link has none)."""
    if not headers:
        return (), None
    head = max(headers.values(), key=lambda header: header.head_key)
    reversed_links = [Link(head, os.path.join(directory, head.name.filename), None, None)]
    current = head
    while current.prev is not None and current.prev in headers:
        prev = headers[current.prev]
        path = os.path.join(directory, prev.name.filename)
        if current.prev_len < HEADER_SIZE or current.name.base_lsn < prev.name.base_lsn:
            raise errors.CorruptData(
                f"{os.path.join(directory, current.name.filename)}: inconsistent predecessor "
                f"{prev.name.filename} (prev_len {current.prev_len})"
            )
        reversed_links.append(Link(prev, path, current.prev_len, current.name.base_lsn))
        current = prev
    reversed_links.reverse()
    return tuple(reversed_links), current.prev
