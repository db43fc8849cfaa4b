"""The local WAL backend: segmented files under ``<root>/<pchannel>/``.

Opening a writer stores a new writer identity (its term and an epoch unique
to this open, see :mod:`.fence`) durably first, then measures the valid
length of the newest segment and starts a new segment that records it, so a
fenced writer's later bytes are never read, even a writer of the same term.
See :mod:`.chain` for how the log is assembled from segments and
:mod:`.writer`/:mod:`.reader` for the rest.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import weakref
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from headrace import errors
from headrace.message.ids import MessageID
from headrace.wal.contract import (
    Backend,
    BackendReader,
    BackendWriter,
    Record,
    StartKind,
    StartPosition,
)
from headrace.wal.local import fence, files, scan, segment
from headrace.wal.local.chain import Chain
from headrace.wal.local.channel import Channel
from headrace.wal.local.fence import Fence
from headrace.wal.local.message_id import LocalMessageID
from headrace.wal.local.reader import POLL_MAX, LocalReader
from headrace.wal.local.segment import HEADER_SIZE, SegmentHeader, SegmentName
from headrace.wal.local.writer import LocalWriter, OpenSegment, WriterSettings

PCHANNEL_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$")
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
MIN_SEGMENT_BYTES = 128
OWNER_CHANGE_WAIT = 5.0
"""How long calls wait for a new owner that stored its identity to create its segment."""

_T = TypeVar("_T")
_P = ParamSpec("_P")


@dataclasses.dataclass(frozen=True, slots=True)
class LocalSettings:
    root: str
    fsync: str = "batch"
    fsync_interval_ms: float = 5.0
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    reserve_bytes: int | None = None
    """Free space appends leave on the file system (None: 5% of it, at most
    64 MiB; 0: none), see :mod:`headrace.wal.local.space`."""

    def __post_init__(self) -> None:
        if not isinstance(self.root, str) or not self.root:
            raise errors.InvalidArgument(
                f"local WAL: root must be a directory path, got {self.root!r}"
            )
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise errors.InvalidArgument(f"local WAL: root {self.root!r} is not a directory")
        if self.fsync not in ("batch", "interval"):
            raise errors.InvalidArgument(
                f"local WAL: fsync must be 'batch' or 'interval', got {self.fsync!r}"
            )
        interval = self.fsync_interval_ms
        if isinstance(interval, bool) or not isinstance(interval, int | float):
            raise errors.InvalidArgument(
                f"local WAL: fsync_interval_ms must be a number, got {interval!r}"
            )
        if not 0 < interval <= 10_000:
            raise errors.InvalidArgument(
                f"local WAL: fsync_interval_ms must be in (0, 10000], got {interval}"
            )
        size = self.segment_bytes
        if isinstance(size, bool) or not isinstance(size, int):
            raise errors.InvalidArgument(
                f"local WAL: segment_bytes must be an integer, got {size!r}"
            )
        if not MIN_SEGMENT_BYTES <= size <= 1 << 40:
            raise errors.InvalidArgument(
                f"local WAL: segment_bytes must be between {MIN_SEGMENT_BYTES} and 2**40, "
                f"got {size}"
            )
        reserve = self.reserve_bytes
        if reserve is not None and (
            isinstance(reserve, bool) or not isinstance(reserve, int) or reserve < 0
        ):
            raise errors.InvalidArgument(
                f"local WAL: reserve_bytes must be a non-negative integer, got {reserve!r}"
            )


@dataclasses.dataclass(frozen=True, slots=True)
class _Checked:
    """A segment found valid up to byte position and LSN ``end``."""

    name: SegmentName
    end: tuple[int, int]


def create(**settings: Any) -> LocalBackend:
    """Registry factory: ``root``, ``fsync``, ``fsync_interval_ms``, ``segment_bytes``,
    ``reserve_bytes``."""
    known = {field.name for field in dataclasses.fields(LocalSettings)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise errors.InvalidArgument(
            f"local WAL: unknown settings {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )
    if "root" not in settings:
        raise errors.InvalidArgument("local WAL: the 'root' directory setting is required")
    root = settings.pop("root")
    return LocalBackend(os.fspath(root), **settings)


def _lsn_of(mid: MessageID | None) -> int:
    if not isinstance(mid, LocalMessageID):
        raise errors.InvalidArgument(f"expected a local message id, got {mid!r}")
    return mid.lsn


class LocalBackend(Backend):
    name = "local"

    def __init__(
        self,
        root: str,
        *,
        fsync: str = "batch",
        fsync_interval_ms: float = 5.0,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        reserve_bytes: int | None = None,
    ) -> None:
        self.settings = LocalSettings(root, fsync, fsync_interval_ms, segment_bytes, reserve_bytes)
        self._writer_settings = WriterSettings(
            fsync, fsync_interval_ms / 1000.0, segment_bytes, reserve_bytes
        )
        self._channels: dict[str, Channel] = {}
        self._writers: dict[str, LocalWriter] = {}
        self._locks: dict[str, int] = {}
        """Per pchannel written here: the directory lock its writers hold (shared)."""
        self._readers: weakref.WeakSet[LocalReader] = weakref.WeakSet()
        self._closed = False

    def _channel(self, pchannel: str) -> Channel:
        if self._closed:
            raise errors.Closed("the local WAL backend was closed")
        if not isinstance(pchannel, str) or not PCHANNEL_PATTERN.match(pchannel):
            raise errors.InvalidArgument(
                f"invalid pchannel name {pchannel!r}: use 1-255 characters of [A-Za-z0-9_.-], "
                "starting with a letter or digit"
            )
        channel = self._channels.get(pchannel)
        if channel is None:
            channel = self._channels[pchannel] = Channel(self.settings.root, pchannel)
        return channel

    async def open_writer(self, pchannel: str, term: int) -> BackendWriter:
        return await self._open_writer_in(pchannel, term, segment.FORMAT_VERSION)

    async def open_writer_for(self, pchannel: str, term: int, message_format: int) -> BackendWriter:
        return await self._open_writer_in(pchannel, term, segment.version_for(message_format))

    async def _open_writer_in(self, pchannel: str, term: int, version: int) -> BackendWriter:
        """Open the writer of ``term``; its segments are of format ``version``."""
        if isinstance(term, bool) or not isinstance(term, int) or not 0 <= term < 1 << 63:
            raise errors.InvalidArgument(f"term must be a non-negative integer, got {term!r}")
        channel = self._channel(pchannel)
        async with channel.opening:
            if pchannel not in self._locks:
                self._locks[pchannel] = await _blocking(self._lock_directory, channel)
            try:
                return await self._open_writer(channel, term, version)
            finally:
                if pchannel not in self._writers:
                    os.close(self._locks.pop(pchannel))

    @staticmethod
    def _lock_directory(channel: Channel) -> int:
        files.ensure_dir(channel.directory)
        fd = files.lock_directory(channel.directory, exclusive=False)
        assert fd is not None  # a shared lock is waited for
        return fd

    async def _open_writer(self, channel: Channel, term: int, version: int) -> LocalWriter:
        pchannel = channel.pchannel
        # Damage is found before the fence is claimed: a refused writer must
        # not leave an identity behind whose segment never comes, which would
        # make every reader wait instead of reading up to the damage.
        checked = await _blocking(self._check_head, channel)
        claimed = await _blocking(self._claim_fence, channel, term)
        previous = self._writers.pop(pchannel, None)
        if previous is not None:
            await previous.supersede(
                fence.fenced_error(
                    pchannel, previous.fence, claimed, "a writer of this process replaced it"
                )
            )
        current = await _blocking(self._start_segment, channel, claimed, version, checked)
        writer = LocalWriter(channel, claimed, current, self._writer_settings, self._writer_closed)
        self._writers[pchannel] = writer
        return writer

    def _writer_closed(self, writer: LocalWriter) -> None:
        if self._writers.get(writer.pchannel) is writer:
            del self._writers[writer.pchannel]
            lock = self._locks.pop(writer.pchannel, None)
            if lock is not None:
                os.close(lock)

    def _claim_fence(self, channel: Channel, term: int) -> Fence:
        files.ensure_dir(channel.directory)
        files.remove_stale_tmp(channel.directory)
        fd = files.open_term_file(channel.directory, write=True)
        try:
            return files.claim_fence(fd, channel.term_path, term, channel.pchannel)
        finally:
            os.close(fd)

    @staticmethod
    def _check_head(channel: Channel) -> _Checked | None:
        """How far the newest segment is valid (blocking); CorruptData if a
        damaged record is followed by valid ones (not a torn tail)."""
        if not os.path.isdir(channel.directory):
            return None
        head = channel.load_chain().head
        if head is None:
            return None
        fd = scan.open_segment(head)
        if fd is None:
            return None
        try:
            return _Checked(head.name, scan.scan_end(fd, head))
        finally:
            os.close(fd)

    def _start_segment(
        self, channel: Channel, claimed: Fence, version: int, checked: _Checked | None = None
    ) -> OpenSegment:
        """Measure the newest segment and start the next one, of format ``version``
        (blocking).

        ``checked``: how far the newest segment was found valid before the
        fence was claimed; measuring goes on from there.
        """
        chain = channel.load_chain()
        head = chain.head
        prev: SegmentName | None = None
        prev_len, base = 0, 0
        if head is not None:
            if head.header.fence > claimed:
                raise errors.Fenced(
                    f"pchannel {channel.pchannel}: segment {head.name.filename} was written "
                    f"by {head.header.fence.describe()}, newer than {claimed.describe()}",
                    term=claimed.term,
                    current_term=head.name.term,
                )
            fd = scan.open_segment(head)
            if fd is None:
                raise errors.Unavailable(f"{head.path} vanished while opening a writer; retry")
            start = checked.end if checked is not None and checked.name == head.name else None
            try:
                prev_len, base = scan.scan_end(fd, head, start)
            finally:
                os.close(fd)
            prev = head.name
        name = SegmentName(base, claimed.term, claimed.epoch)
        fd = files.create_segment(
            channel.directory,
            SegmentHeader(name, prev, prev_len, version),
            sync_writes=self._writer_settings.sync_writes,
        )
        stored = channel.fence()
        if stored != claimed:
            os.close(fd)
            raise fence.fenced_error(
                channel.pchannel, claimed, stored, "another open took over while it was opening"
            )
        return OpenSegment(
            name, fd, HEADER_SIZE, base, os.path.join(channel.directory, name.filename), version
        )

    async def open_reader(self, pchannel: str, start: StartPosition) -> BackendReader:
        channel = self._channel(pchannel)
        target: int | None
        if start.kind is StartKind.EARLIEST:
            target = None
        elif start.kind is StartKind.LATEST:
            target = await self._consistent(channel, lambda chain: self._end_lsn(channel, chain))
        elif start.kind is StartKind.AT:
            target = _lsn_of(start.id)
        else:
            target = _lsn_of(start.id) + 1
        reader = LocalReader(channel, target)
        self._readers.add(reader)
        return reader

    @staticmethod
    def _capped(channel: Channel, chain: Chain) -> Chain:
        """The chain with the head bounded by what this process's writer acknowledged."""
        active, head = channel.active, chain.head
        if active is None or head is None or head.name != active[0]:
            return chain
        capped = dataclasses.replace(head, limit=active[1], end_lsn=active[2])
        return dataclasses.replace(chain, links=(*chain.links[:-1], capped))

    def _end_lsn(self, channel: Channel, chain: Chain) -> int:
        active, head = channel.active, chain.head
        if active is not None and head is not None and head.name == active[0]:
            return active[2]
        return scan.end_lsn(chain)

    async def _consistent(self, channel: Channel, compute: Callable[[Chain], _T]) -> _T:
        """``compute`` over a trusted chain while the stored writer identity stays the same."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + OWNER_CHANGE_WAIT
        while True:
            result = await _blocking(self._try_consistent, channel, compute)
            if result is not None:
                return result[0]
            if loop.time() > deadline:
                raise errors.Unavailable(
                    f"pchannel {channel.pchannel}: an owner change is in progress (a new writer "
                    "identity was stored but its segment does not exist yet); retry later"
                )
            await asyncio.sleep(POLL_MAX)

    @staticmethod
    def _try_consistent(channel: Channel, compute: Callable[[Chain], _T]) -> tuple[_T] | None:
        chain = channel.load_chain()
        if not chain.trusted:
            return None
        value = compute(chain)
        if channel.fence() != chain.fence:
            return None
        return (value,)

    async def last_record(self, pchannel: str) -> Record | None:
        channel = self._channel(pchannel)
        return await self._consistent(
            channel, lambda chain: scan.last_record(self._capped(channel, chain))
        )

    async def earliest(self, pchannel: str) -> MessageID | None:
        channel = self._channel(pchannel)

        def compute(chain: Chain) -> MessageID | None:
            head = chain.head
            if head is None:
                return None
            first = chain.first_lsn
            if first < head.base_lsn or first < self._end_lsn(channel, chain):
                return LocalMessageID(first)
            return None

        return await self._consistent(channel, compute)

    async def truncate(self, pchannel: str, before: MessageID) -> None:
        lsn = _lsn_of(before)
        channel = self._channel(pchannel)
        await self._consistent(channel, lambda chain: self._truncate(channel, chain, lsn))

    def _truncate(self, channel: Channel, chain: Chain, lsn: int) -> None:
        """Write the marker, then delete whole segments below it (blocking)."""
        if not chain.links:
            return
        cut = min(lsn, self._end_lsn(channel, chain))
        with files.marker_lock(channel.directory):
            marker = files.read_marker(channel.directory)
            if cut > marker:
                files.write_marker(channel.directory, cut)
                marker = cut
        keep = chain.links[-1].name
        doomed = []
        for link in chain.links[:-1]:
            if link.end_lsn is not None and link.end_lsn <= marker:
                doomed.append(link.name)
            else:
                keep = link.name
                break
        on_chain = {link.name for link in chain.links}
        doomed += [
            name
            for name in files.list_segments(channel.directory)
            if name not in on_chain and name.base_lsn < keep.base_lsn
        ]
        for name in doomed:
            try:
                os.unlink(os.path.join(channel.directory, name.filename))
            except FileNotFoundError:
                continue
        if doomed:
            files.fsync_dir(channel.directory)
            channel.forget(doomed)

    async def close(self) -> None:
        if self._closed:
            return
        for writer in list(self._writers.values()):
            await writer.close()
        for reader in list(self._readers):
            await reader.close()
        self._closed = True
        for channel in self._channels.values():
            channel.close()

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, **dataclasses.asdict(self.settings)}


async def _blocking(func: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Run blocking file work in a thread; OSErrors become Headrace errors."""
    try:
        return await asyncio.to_thread(func, *args, **kwargs)
    except OSError as exc:
        raise files.storage_error(
            exc, f"local WAL {getattr(func, '__name__', 'operation')}"
        ) from None
