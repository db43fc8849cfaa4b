"""Offline repair of a damaged local WAL (``headrace wal repair``).

A damaged record in the middle of a pchannel's log (a bad CRC, a segment cut
short, garbage followed by valid records) stops the pchannel at that record.
Repair keeps the valid prefix, everything before the first damaged record,
as the log, and moves the rest aside into ``<pchannel>/quarantine-<time>/``
next to the segments: the bytes of the damaged segment from the damaged
record on (``<segment>.from-<offset>``) and every later segment file. Nothing
is deleted. The records moved aside are no longer part of the log: a new
writer continues after the kept prefix.

A torn tail of the newest segment (a crash in the middle of a write) is not
damage: a writer cuts it away when it opens, and repair leaves it alone.

Repair takes the pchannel directory's lock exclusively and refuses to run
while a writer holds it (a node serving the pchannel). A node that holds the
pchannel as CORRUPT has no writer: repair runs beside it, and the node opens
the repaired log on its next try.
"""

from __future__ import annotations

import dataclasses
import os
import time

from headrace import errors
from headrace.wal.local import files, scan, segment
from headrace.wal.local.backend import PCHANNEL_PATTERN
from headrace.wal.local.chain import Chain, name_key
from headrace.wal.local.channel import Channel
from headrace.wal.local.segment import SegmentName


@dataclasses.dataclass(frozen=True, slots=True)
class Damage:
    """The first damaged record of a log."""

    path: str
    offset: int
    lsn: int


@dataclasses.dataclass(frozen=True, slots=True)
class RepairReport:
    pchannel: str
    directory: str
    damage: Damage | None
    """None: no damage was found and nothing was changed."""
    quarantine: str = ""
    moved: tuple[str, ...] = ()
    """What was moved into ``quarantine`` (file names there)."""
    moved_bytes: int = 0

    def summary(self) -> str:
        if self.damage is None:
            return (
                f"pchannel {self.pchannel}: no damaged record found in {self.directory}; "
                "nothing changed"
            )
        return (
            f"pchannel {self.pchannel}: damaged record {self.damage.lsn} at byte offset "
            f"{self.damage.offset} of {self.damage.path}; kept records below {self.damage.lsn}; "
            f"moved {self.moved_bytes} bytes aside into {self.quarantine}: "
            f"{', '.join(self.moved)}; nothing was deleted"
        )


def repair(root: str, pchannel: str, *, now: float | None = None) -> RepairReport:
    """Keep the valid prefix of ``pchannel``'s log under ``root``, move the rest aside."""
    if not isinstance(pchannel, str) or not PCHANNEL_PATTERN.match(pchannel):
        raise errors.InvalidArgument(f"invalid pchannel name {pchannel!r}")
    channel = Channel(os.fspath(root), pchannel)
    directory = channel.directory
    if not os.path.isdir(directory):
        raise errors.InvalidArgument(f"no local WAL for pchannel {pchannel} under {root}")
    try:
        lock = files.lock_directory(directory, exclusive=True)
        if lock is None:
            raise errors.Conflict(
                f"pchannel {pchannel} is being written (a node holds a writer on {directory}); "
                "stop the node or move the pchannel away first, then repair"
            )
        try:
            return _repair_locked(channel, now if now is not None else time.time())
        finally:
            os.close(lock)
    except OSError as exc:
        raise files.storage_error(exc, f"repairing {directory}") from None
    finally:
        channel.close()


def find_first_damage(chain: Chain) -> tuple[int, Damage] | None:
    """The chain link holding the first damaged record, and where it is."""
    for index, link in enumerate(chain.links):
        fd = scan.open_segment(link)
        if fd is None:
            raise errors.Unavailable(f"{link.path} vanished while it was checked; retry")
        try:
            found = scan.find_damage(fd, link)
        finally:
            os.close(fd)
        if found is not None:
            return index, Damage(link.path, found[0], found[1])
    return None


class _Aside:
    """The quarantine directory of one repair, created at its first use."""

    def __init__(self, directory: str, now: float) -> None:
        self.directory = directory
        self.path = ""
        self.moved: list[str] = []
        self.moved_bytes = 0
        self._stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))

    def _ensure(self, lsn: int) -> str:
        if not self.path:
            self.path = os.path.join(self.directory, f"quarantine-{self._stamp}-lsn{lsn}")
            os.mkdir(self.path)
            files.fsync_dir(self.directory)
        return self.path

    def cut(self, damage: Damage, name: SegmentName) -> None:
        """Copy the segment from the damaged record on aside (synced), then cut it there."""
        tail_name = f"{name.filename}.from-{damage.offset}"
        target = os.path.join(self._ensure(damage.lsn), tail_name)
        self.moved_bytes += _copy_tail(damage.path, damage.offset, target)
        self.moved.append(tail_name)
        fd = os.open(damage.path, os.O_WRONLY)
        try:
            os.ftruncate(fd, damage.offset)
            os.fsync(fd)
        finally:
            os.close(fd)

    def move(self, names: list[SegmentName], lsn: int) -> None:
        for name in names:
            source = os.path.join(self.directory, name.filename)
            self.moved_bytes += os.stat(source).st_size
            os.rename(source, os.path.join(self._ensure(lsn), name.filename))
            self.moved.append(name.filename)

    def sync(self) -> None:
        if self.path:
            files.fsync_dir(self.path)
            files.fsync_dir(self.directory)


def damaged_header(channel: Channel) -> Damage | None:
    """The first segment whose header cannot be read, if any: the log cannot
    be assembled past it."""
    broken = channel.load_chain().broken
    if broken is None:
        return None
    name = segment.parse_name(os.path.basename(broken.path))
    if name is None or os.path.dirname(broken.path) != channel.directory:
        raise broken
    return Damage(broken.path, broken.offset, name.base_lsn)


def _repair_locked(channel: Channel, now: float) -> RepairReport:
    directory = channel.directory
    aside = _Aside(directory, now)
    damage = damaged_header(channel)
    if damage is not None:
        # A segment whose header is damaged, and every segment after it, go aside.
        bad = segment.parse_name(os.path.basename(damage.path))
        assert bad is not None
        bad_key = _takeover_key(directory, bad)
        later = [
            n for n in files.list_segments(directory) if _takeover_key(directory, n) >= bad_key
        ]
        aside.move(later, damage.lsn)
        channel.forget(later)
    chain = channel.load_chain()
    found = find_first_damage(chain)
    if found is not None:
        index, damage = found
        head = chain.links[index].name
        aside.cut(damage, head)
        # Every segment that could otherwise still take over the log: the later
        # links of the chain and any segment that sorts after the new head.
        aside.move(_after(directory, head), damage.lsn)
    aside.sync()
    if damage is None:
        return RepairReport(channel.pchannel, directory, None)
    return RepairReport(
        channel.pchannel, directory, damage, aside.path, tuple(aside.moved), aside.moved_bytes
    )


def _takeover_key(directory: str, name: SegmentName) -> tuple[int, int, int, int]:
    """The order in which segment ``name`` would take over the log (its
    header's :attr:`~.segment.SegmentHeader.head_key`); for a segment whose
    header cannot be read, its name read as the current format writes it."""
    try:
        header = files.read_header(directory, name)
    except errors.CorruptData:
        header = None
    if header is None:
        return name_key(name)
    return header.head_key


def _after(directory: str, head: SegmentName) -> list[SegmentName]:
    """The segments that would take over the log from ``head``."""
    head_key = _takeover_key(directory, head)
    return [n for n in files.list_segments(directory) if _takeover_key(directory, n) > head_key]


def _copy_tail(path: str, offset: int, target: str) -> int:
    """Copy ``path`` from ``offset`` to its end into the new file ``target``, durably."""
    copied = 0
    source = os.open(path, os.O_RDONLY)
    try:
        sink = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            while chunk := os.pread(source, scan.CHUNK_BYTES, offset + copied):
                files.write_all(sink, chunk, copied)
                copied += len(chunk)
            os.fsync(sink)
        finally:
            os.close(sink)
    finally:
        os.close(source)
    return copied
