"""The local WAL reader: follows the segment chain and waits at the tail.

Segments with a successor are read up to the successor's ``prev_len``. The
head is read up to what this process's writer acknowledged, or, for a writer
in another process, up to its last complete valid record; such bytes are
delivered only if the stored writer identity, re-read after reading them, is
still the head's (so they lie below any new owner's measurement). Otherwise the
reader waits for the new owner's segment, which tells how far to read.
Readers are woken by a writer of the same process and poll otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from headrace import errors
from headrace.wal.contract import BackendReader, Record, RecordBlock
from headrace.wal.local import files, scan
from headrace.wal.local.chain import Chain, Link
from headrace.wal.local.channel import Channel
from headrace.wal.local.message_id import LocalMessageID
from headrace.wal.local.segment import HEADER_SIZE, Parsed, Stop

POLL_MIN = 0.005
POLL_MAX = 0.02
_EMPTY = RecordBlock((), b"", (), True)
IN_PROCESS_WAIT = 0.5
"""Longest wait for a same-process writer's notification before re-checking."""


def truncated(chain: Chain, lsn: int) -> errors.Truncated:
    earliest = str(LocalMessageID(chain.first_lsn))
    return errors.Truncated(
        f"pchannel position local:{lsn} was truncated; the earliest readable id is {earliest}",
        earliest=earliest,
    )


class LocalReader(BackendReader):
    def __init__(self, channel: Channel, target: int | None) -> None:
        """``target``: first LSN to deliver; None for the earliest available."""
        self._channel = channel
        self._target = target
        self._chain: Chain | None = None
        self._index = 0
        self._fd = -1
        self._pos = 0
        self._lsn = 0
        self._pending: RecordBlock | None = None
        """Read but not yet returned: ``_pending`` from record ``_pending_at`` on."""
        self._pending_at = 0
        self._lock = asyncio.Lock()
        self._closed = False

    async def next_batch(
        self,
        max_records: int = 1024,
        timeout: float | None = None,
    ) -> list[Record]:
        return (await self.next_block(max_records, timeout)).records()

    async def next_block(
        self,
        max_records: int = 1024,
        timeout: float | None = None,
    ) -> RecordBlock:
        """The next records as one verified block (the chunk read from the file)."""
        if max_records < 1:
            raise errors.InvalidArgument(f"max_records must be at least 1, got {max_records}")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = POLL_MIN
        while True:
            if self._closed:
                raise errors.Closed(f"reader of pchannel {self._channel.pchannel} is closed")
            if self._pending is not None:
                return self._take(max_records)
            changed = self._channel.changed()
            async with self._lock:
                if self._closed or self._pending is not None:
                    continue
                try:
                    self._pending = await asyncio.to_thread(self._step)
                except OSError as exc:
                    raise files.storage_error(
                        exc, f"reading pchannel {self._channel.pchannel}"
                    ) from None
                self._pending_at = 0
            if self._pending is not None:
                delay = POLL_MIN
                continue
            wait = IN_PROCESS_WAIT if self._follows_local_writer() else delay
            delay = min(delay * 2, POLL_MAX)
            if deadline is not None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return _EMPTY
                wait = min(wait, remaining)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), wait)

    def _follows_local_writer(self) -> bool:
        active = self._channel.active
        chain = self._chain
        return (
            active is not None
            and chain is not None
            and self._index == len(chain.links) - 1
            and chain.links[-1].name == active[0]
        )

    def _take(self, max_records: int) -> RecordBlock:
        """Up to ``max_records`` of the pending records."""
        block, at = self._pending, self._pending_at
        assert block is not None
        count = len(block.ids)
        if at == 0 and count <= max_records:
            self._pending = None
            return block
        stop = min(count, at + max_records)
        part = RecordBlock(block.ids[at:stop], block.data, block.bounds[2 * at : 2 * stop], True)
        if stop == count:
            self._pending = None
        else:
            self._pending_at = stop
        return part

    def _step(self) -> RecordBlock | None:
        """Read what is available now (blocking); None if nothing is."""
        chain = self._chain
        if chain is None:
            chain = self._position()
            if chain is None:
                return None
        while True:
            link = chain.links[self._index]
            if link.limit is not None:
                block = self._read_bounded(link)
                if block is None:
                    chain = self._next_link(chain)
                    continue
                return block
            block, refresh = self._read_head(link)
            if block is not None or not refresh:
                return block
            newer = self._channel.load_chain()
            if not newer.trusted:
                return None
            index = newer.position_of(link.name)
            if index is None:
                raise self._lost(newer, link)
            chain = self._chain = newer
            self._index = index
            if newer.links[index].limit is None:
                return None

    def _position(self) -> Chain | None:
        chain = self._channel.load_chain()
        if not chain.links and chain.broken is not None:
            raise chain.broken
        if not chain.trusted or not chain.links:
            return None
        target = chain.first_lsn if self._target is None else self._target
        if target < chain.first_lsn:
            raise truncated(chain, target)
        index = chain.index_of(target)
        link = chain.links[index]
        fd = scan.open_segment(link)
        if fd is None:
            raise truncated(self._channel.load_chain(), target)
        self._fd = fd
        self._pos, self._lsn = scan.skip_to(fd, link, target)
        self._target = target
        self._chain, self._index = chain, index
        return chain

    def _deliver(self, parsed: Parsed) -> RecordBlock | None:
        """The parsed records at or after the target; None if there are none."""
        self._pos, self._lsn = parsed.pos, parsed.lsn
        skip = max(0, (self._target or 0) - parsed.first_lsn)
        if skip >= parsed.n_records:
            return None
        return parsed.block(skip)

    def _read_bounded(self, link: Link) -> RecordBlock | None:
        """Records of a segment with a known end; None once it is exhausted."""
        while self._pos < (link.limit or 0):
            parsed = scan.read_chunk(
                self._fd, self._pos, self._lsn, link.limit, scan.ALL, checksum=link.header.checksum
            )
            if not parsed.n_records:
                raise scan.strict_failure(link, parsed)
            block = self._deliver(parsed)
            if block is not None:
                return block
        if link.end_lsn is not None and self._lsn != link.end_lsn:
            raise errors.CorruptData(
                f"{link.path}: ends with record {self._lsn - 1} but its successor starts "
                f"at {link.end_lsn}",
                path=link.path,
                offset=self._pos,
            )
        return None

    def _next_link(self, chain: Chain) -> Chain:
        if self._index + 1 == len(chain.links) and chain.broken is not None:
            raise chain.broken
        self._index += 1
        link = chain.links[self._index]
        os.close(self._fd)
        self._fd = -1
        fd = scan.open_segment(link)
        if fd is None:
            raise truncated(self._channel.load_chain(), self._lsn)
        self._fd, self._pos = fd, HEADER_SIZE
        return chain

    def _read_head(self, link: Link) -> tuple[RecordBlock | None, bool]:
        """Records of the head (None if none); whether the chain should be re-read."""
        active = self._channel.active
        if active is not None and active[0] == link.name:
            parsed = scan.read_chunk(
                self._fd, self._pos, self._lsn, active[1], scan.ALL, checksum=link.header.checksum
            )
            if not parsed.n_records and parsed.pos < active[1]:
                raise scan.strict_failure(link, parsed)
            return self._deliver(parsed), False
        parsed = scan.read_chunk(
            self._fd, self._pos, self._lsn, None, scan.ALL, checksum=link.header.checksum
        )
        if parsed.n_records:
            if self._channel.fence() <= link.header.fence:
                return self._deliver(parsed), False
        elif parsed.stop is Stop.BAD:
            scan.check_bad_tail(self._fd, link, parsed.pos, parsed.lsn)
        return None, True

    def _lost(self, chain: Chain, link: Link) -> errors.HeadraceError:
        if chain.first_lsn > self._lsn:
            return truncated(chain, self._lsn)
        return errors.CorruptData(
            f"{link.path}: segment is no longer part of the log of pchannel "
            f"{self._channel.pchannel}"
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        async with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        self._channel.notify()
