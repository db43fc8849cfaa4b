"""An in-process WAL backend for tests: records live in a dict of lists.

Every :class:`MemoryBackend` instance is independent. It keeps the contract's
term rules exactly (lower terms are fenced at open and on append), so the
framework WAL can be tested against it without files or brokers.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

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
from headrace.wal.memory.message_id import MemoryMessageID


@dataclasses.dataclass
class _Channel:
    """State of one pchannel: ``records[i]`` has sequence ``first_seq + i``."""

    records: list[bytes] = dataclasses.field(default_factory=list)
    first_seq: int = 0
    term: int = 0
    changed: asyncio.Condition = dataclasses.field(default_factory=asyncio.Condition)

    @property
    def next_seq(self) -> int:
        return self.first_seq + len(self.records)

    def truncated_error(self, seq: int) -> errors.Truncated:
        earliest = str(MemoryMessageID(self.first_seq))
        return errors.Truncated(
            f"memory:{seq} was truncated; the earliest readable id is {earliest}",
            earliest=earliest,
        )


def _seq_of(mid: MessageID | None) -> int:
    if not isinstance(mid, MemoryMessageID):
        raise errors.InvalidArgument(f"expected a memory message id, got {mid!r}")
    return mid.seq


def _check_pchannel(pchannel: str) -> None:
    if not isinstance(pchannel, str) or not pchannel:
        raise errors.InvalidArgument(f"invalid pchannel name {pchannel!r}")


class MemoryStore:
    """The records of a set of pchannels; outlives the backends opened on it."""

    def __init__(self) -> None:
        self.channels: dict[str, _Channel] = {}


class MemoryBackend(Backend):
    """In-process backend; no global state, so each test can make a fresh one.

    Backends made with the same ``store`` share its pchannels, like clients of
    one broker: tests use that to reopen a log or to run two owners at once.
    """

    name = "memory"

    def __init__(self, store: MemoryStore | None = None) -> None:
        self._channels = (store or MemoryStore()).channels
        self._closed = False

    def _channel(self, pchannel: str) -> _Channel:
        _check_pchannel(pchannel)
        if self._closed:
            raise errors.Closed("the memory WAL backend was closed")
        channel = self._channels.get(pchannel)
        if channel is None:
            channel = self._channels[pchannel] = _Channel()
        return channel

    async def open_writer(self, pchannel: str, term: int) -> BackendWriter:
        if isinstance(term, bool) or not isinstance(term, int) or term < 0:
            raise errors.InvalidArgument(f"term must be a non-negative integer, got {term!r}")
        channel = self._channel(pchannel)
        if term < channel.term:
            raise errors.Fenced(
                f"pchannel {pchannel}: term {term} is older than term {channel.term}",
                term=term,
                current_term=channel.term,
            )
        channel.term = term
        return MemoryWriter(self, pchannel, term, channel)

    async def open_reader(self, pchannel: str, start: StartPosition) -> BackendReader:
        channel = self._channel(pchannel)
        position: int | None
        if start.kind is StartKind.EARLIEST:
            position = None
        elif start.kind is StartKind.LATEST:
            position = channel.next_seq
        elif start.kind is StartKind.AT:
            position = _seq_of(start.id)
        else:
            position = _seq_of(start.id) + 1
        return MemoryReader(self, channel, position)

    async def last_record(self, pchannel: str) -> Record | None:
        channel = self._channel(pchannel)
        if not channel.records:
            return None
        return Record(MemoryMessageID(channel.next_seq - 1), channel.records[-1])

    async def truncate(self, pchannel: str, before: MessageID) -> None:
        channel = self._channel(pchannel)
        cut = min(_seq_of(before), channel.next_seq)
        if cut > channel.first_seq:
            del channel.records[: cut - channel.first_seq]
            channel.first_seq = cut

    async def earliest(self, pchannel: str) -> MessageID | None:
        channel = self._channel(pchannel)
        return MemoryMessageID(channel.first_seq) if channel.records else None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for channel in self._channels.values():
            async with channel.changed:
                channel.changed.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "pchannels": len(self._channels)}


class MemoryWriter(BackendWriter):
    def __init__(self, backend: MemoryBackend, pchannel: str, term: int, channel: _Channel) -> None:
        self.pchannel = pchannel
        self.term = term
        self._backend = backend
        self._channel = channel
        self._closed = False

    async def append(self, records: Sequence[bytes]) -> list[MessageID]:
        if self._closed or self._backend.closed:
            raise errors.Closed(f"writer of pchannel {self.pchannel} (term {self.term}) is closed")
        channel = self._channel
        if self.term < channel.term:
            raise errors.Fenced(
                f"pchannel {self.pchannel}: writer of term {self.term} was fenced by "
                f"term {channel.term}",
                term=self.term,
                current_term=channel.term,
            )
        data = [bytes(record) for record in records]
        first = channel.next_seq
        channel.records.extend(data)
        async with channel.changed:
            channel.changed.notify_all()
        return [MemoryMessageID(first + i) for i in range(len(data))]

    async def close(self) -> None:
        self._closed = True


class MemoryReader(BackendReader):
    def __init__(self, backend: MemoryBackend, channel: _Channel, position: int | None) -> None:
        self._backend = backend
        self._channel = channel
        self._position = position
        self._closed = False

    def _check_open(self) -> None:
        if self._closed or self._backend.closed:
            raise errors.Closed("the memory WAL reader was closed")

    async def next_batch(
        self,
        max_records: int = 1024,
        timeout: float | None = None,
    ) -> list[Record]:
        if max_records < 1:
            raise errors.InvalidArgument(f"max_records must be at least 1, got {max_records}")
        channel = self._channel
        async with channel.changed:
            loop = asyncio.get_running_loop()
            deadline = None if timeout is None else loop.time() + timeout
            while True:
                self._check_open()
                position = channel.first_seq if self._position is None else self._position
                if position < channel.first_seq:
                    raise channel.truncated_error(position)
                available = channel.next_seq - position
                if available > 0:
                    count = min(available, max_records)
                    base = position - channel.first_seq
                    data = channel.records[base : base + count]
                    self._position = position + count
                    return [Record(MemoryMessageID(position + i), d) for i, d in enumerate(data)]
                if deadline is None:
                    await channel.changed.wait()
                    continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return []
                try:
                    await asyncio.wait_for(channel.changed.wait(), remaining)
                except TimeoutError:
                    return []

    async def close(self) -> None:
        self._closed = True
