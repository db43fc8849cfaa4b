"""Per-pchannel state one local backend shares between its writer and readers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading

from headrace import errors
from headrace.wal.local import chain, fence, files, scan
from headrace.wal.local.fence import Fence
from headrace.wal.local.segment import SegmentHeader, SegmentName


class Channel:
    """Files and in-process coordination of one pchannel.

    Blocking methods (``fence``, ``load_chain``) run in worker threads; the
    ``active``/``notify`` part is used on the event loop only.
    """

    def __init__(self, root: str, pchannel: str) -> None:
        self.pchannel = pchannel
        self.directory = os.path.join(root, pchannel)
        self.term_path = os.path.join(self.directory, files.TERM_FILE)
        self._headers: dict[SegmentName, SegmentHeader] = {}
        self._term_fd: int | None = None
        self._lock = threading.Lock()
        self.active: tuple[SegmentName, int, int] | None = None
        """Segment of this process's writer, its acknowledged length and next LSN."""
        self._changed = asyncio.Event()
        self._watched = False
        """Somebody took ``_changed`` since the last :meth:`notify`."""
        self.opening = asyncio.Lock()
        """Serialises this process's ``open_writer`` calls of the pchannel."""

    def fence(self) -> Fence:
        """The stored writer identity (NO_FENCE before any writer opened)."""
        return fence.decode(self.term_bytes(), self.term_path)

    def term_bytes(self) -> bytes:
        """The term file's bytes as stored (empty before any writer opened): a
        writer compares them with its own encoded identity, without decoding."""
        fd = self._term_fd
        if fd is None:
            with self._lock:
                if self._term_fd is None:
                    try:
                        self._term_fd = files.open_term_file(self.directory, write=False)
                    except FileNotFoundError:
                        return b""
                fd = self._term_fd
        return files.read_term_bytes(fd)

    def load_chain(self) -> chain.Chain:
        """List the segments, then read the fence: the chain as of now.

        A damaged segment header breaks the chain there (see :mod:`.chain`).
        """
        names = files.list_segments(self.directory)
        headers: dict[SegmentName, SegmentHeader] = {}
        damaged: dict[SegmentName, errors.CorruptData] = {}
        for name in names:
            header = self._headers.get(name)
            if header is None:
                try:
                    header = files.read_header(self.directory, name)
                except errors.CorruptData as exc:
                    damaged[name] = exc
                    continue
                if header is None:
                    continue
                self._headers[name] = header
            headers[name] = header
        stored = self.fence()
        marker = files.read_marker(self.directory)
        built = chain.build_chain(self.directory, headers, stored, marker, damaged)
        if built.broken is not None and built.links:
            return scan.bound_last(built)
        return built

    def forget(self, names: list[SegmentName]) -> None:
        for name in names:
            self._headers.pop(name, None)

    def changed(self) -> asyncio.Event:
        """An event set at the next :meth:`notify` (take it before checking)."""
        self._watched = True
        return self._changed

    def notify(self) -> None:
        """Set the event readers took (a new one is made only if one was taken)."""
        if self._watched:
            self._watched = False
            self._changed.set()
            self._changed = asyncio.Event()

    def close(self) -> None:
        with self._lock:
            if self._term_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._term_fd)
                self._term_fd = None
