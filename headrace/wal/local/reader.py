"""The local WAL reader: follows the segment chain and waits at the tail.

Segments with a successor are read up to the successor's ``prev_len``. The
head is read up to what this process's writer acknowledged, or, for a writer
in another process, up to its last complete valid record; such bytes are
delivered only if the stored term, re-read after reading them, is still the
head's term (so they lie below any new owner's measurement). Otherwise the
reader waits for the new owner's segment, which tells how far to read.
Readers are woken by a writer of the same process and poll otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from headrace import errors
from headrace.wal.contract import BackendReader, Record
from headrace.wal.local import files, scan
from headrace.wal.local.chain import Chain, Link
from headrace.wal.local.channel import Channel
from headrace.wal.local.message_id import LocalMessageID
from headrace.wal.local.segment import HEADER_SIZE, Stop

POLL_MIN = 0.005
POLL_MAX = 0.02
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
        self._pending: list[Record] = []
        self._lock = asyncio.Lock()
        self._closed = False

    async def next_batch(
        self,
        max_records: int = 1024,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> list[Record]:
        if max_records < 1:
            raise errors.InvalidArgument(f"max_records must be at least 1, got {max_records}")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = POLL_MIN
        while True:
            if self._closed:
                raise errors.Closed(f"reader of pchannel {self._channel.pchannel} is closed")
            if self._pending:
                batch = self._pending[:max_records]
                del self._pending[:max_records]
                return batch
            changed = self._channel.changed()
            async with self._lock:
                if self._closed or self._pending:
                    continue
                try:
                    self._pending = await asyncio.to_thread(self._step)
                except OSError as exc:
                    raise files.storage_error(
                        exc, f"reading pchannel {self._channel.pchannel}"
                    ) from None
            if self._pending:
                delay = POLL_MIN
                continue
            wait = IN_PROCESS_WAIT if self._follows_local_writer() else delay
            delay = min(delay * 2, POLL_MAX)
            if deadline is not None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return []
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

    def _step(self) -> list[Record]:
        """Read what is available now (blocking); [] if nothing is."""
        chain = self._chain
        if chain is None:
            chain = self._position()
            if chain is None:
                return []
        while True:
            link = chain.links[self._index]
            if link.limit is not None:
                records = self._read_bounded(link)
                if records is None:
                    chain = self._next_link(chain)
                    continue
                return records
            records, refresh = self._read_head(link)
            if records or not refresh:
                return records
            newer = self._channel.load_chain()
            if not newer.trusted:
                return []
            index = newer.position_of(link.name)
            if index is None:
                raise self._lost(newer, link)
            chain = self._chain = newer
            self._index = index
            if newer.links[index].limit is None:
                return []

    def _position(self) -> Chain | None:
        chain = self._channel.load_chain()
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

    def _deliver(self, records: list[Record], pos: int, lsn: int) -> list[Record]:
        self._pos, self._lsn = pos, lsn
        target = self._target or 0
        if records and records[0].id.sort_key()[0] < target:
            records = [r for r in records if r.id.sort_key()[0] >= target]
        return records

    def _read_bounded(self, link: Link) -> list[Record] | None:
        """Records of a segment with a known end; None once it is exhausted."""
        while self._pos < (link.limit or 0):
            parsed = scan.read_chunk(self._fd, self._pos, self._lsn, link.limit, scan.ALL)
            if not parsed.records:
                raise scan.strict_failure(link, parsed)
            records = self._deliver(parsed.records, parsed.pos, parsed.lsn)
            if records:
                return records
        if link.end_lsn is not None and self._lsn != link.end_lsn:
            raise errors.CorruptData(
                f"{link.path}: ends with record {self._lsn - 1} but its successor starts "
                f"at {link.end_lsn}"
            )
        return None

    def _next_link(self, chain: Chain) -> Chain:
        self._index += 1
        link = chain.links[self._index]
        os.close(self._fd)
        self._fd = -1
        fd = scan.open_segment(link)
        if fd is None:
            raise truncated(self._channel.load_chain(), self._lsn)
        self._fd, self._pos = fd, HEADER_SIZE
        return chain

    def _read_head(self, link: Link) -> tuple[list[Record], bool]:
        """Records of the head; whether the chain should be re-read."""
        active = self._channel.active
        if active is not None and active[0] == link.name:
            parsed = scan.read_chunk(self._fd, self._pos, self._lsn, active[1], scan.ALL)
            if not parsed.records and parsed.pos < active[1]:
                raise scan.strict_failure(link, parsed)
            return self._deliver(parsed.records, parsed.pos, parsed.lsn), False
        parsed = scan.read_chunk(self._fd, self._pos, self._lsn, None, scan.ALL)
        if parsed.records:
            if self._channel.term() <= link.name.term:
                return self._deliver(parsed.records, parsed.pos, parsed.lsn), False
        elif parsed.stop is Stop.BAD:
            scan.check_bad_tail(self._fd, link.path, parsed.pos, parsed.lsn)
        return [], True

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
