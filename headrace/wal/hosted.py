"""What a node hosts for a pchannel, whatever state its log is in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from headrace import errors
from headrace.message.ids import MessageID
from headrace.message.types import Message
from headrace.wal.api import AppendResult, BatchAppendResult, ReadOptions, WALState
from headrace.wal.scanner import Scanner


class HostedWAL(Protocol):
    """What a node hosts for a pchannel: a serving framework WAL, or a damaged
    log kept readable up to its damage (:mod:`headrace.wal.damaged`)."""

    @property
    def pchannel(self) -> str: ...

    @property
    def term(self) -> int: ...

    @property
    def state(self) -> WALState: ...

    @property
    def last_timetick(self) -> int: ...

    @property
    def last_id(self) -> MessageID | None: ...

    @property
    def message_format(self) -> int: ...

    @property
    def max_batch_bytes(self) -> int: ...

    async def append_many(
        self, msgs: Sequence[Message]
    ) -> list[AppendResult | errors.HeadraceError]: ...

    async def append_batches(
        self, batches: Sequence[bytes]
    ) -> list[BatchAppendResult | errors.HeadraceError]: ...

    def read(self, options: ReadOptions) -> Scanner: ...

    async def drain(self) -> None: ...

    async def close(self) -> None: ...

    def stats(self) -> dict[str, object]: ...
