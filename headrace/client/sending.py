"""What a producer and its lanes share: options, messages on their way, outcomes."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping

from headrace import errors
from headrace.message.types import Message
from headrace.wal.api import AppendResult

Outcome = AppendResult | errors.HeadraceError
"""What one message comes to: its result once acknowledged, else its error."""


@dataclasses.dataclass(frozen=True, slots=True)
class ProducerOptions:
    max_batch_messages: int = 512
    max_batch_bytes: int = 1 << 20
    linger: float = 0.0
    """Seconds a part-filled batch waits for more messages (0: send what is queued)."""
    max_inflight_bytes: int = 64 << 20
    """Bytes of unacknowledged messages; ``send`` waits while they are more."""
    max_inflight_batches: int = 8
    """Batches on the wire per pchannel before the first is answered."""
    deadline: float = 60.0
    """Seconds a message may take, retries included, before it fails."""
    retry_backoff: float = 0.05
    max_retry_backoff: float = 1.0
    max_rows_bytes: int = 1 << 20
    """Largest payload ``insert`` and ``delete`` put in one message; larger
    inputs are cut by rows into several messages."""

    def __post_init__(self) -> None:
        if self.max_batch_messages < 1 or self.max_batch_bytes < 1:
            raise errors.InvalidArgument("batch limits must be positive")
        if self.max_inflight_batches < 1 or self.max_inflight_bytes < 1:
            raise errors.InvalidArgument("in-flight limits must be positive")
        if self.max_rows_bytes < 1:
            raise errors.InvalidArgument(
                f"max_rows_bytes must be positive, got {self.max_rows_bytes}"
            )
        if self.deadline <= 0:
            raise errors.InvalidArgument(f"deadline must be positive, got {self.deadline}")


class Group:
    """The outcomes of one ``send``/``send_many`` call."""

    __slots__ = ("future", "remaining", "results")

    def __init__(self, count: int) -> None:
        self.future: asyncio.Future[list[Outcome]] = asyncio.get_running_loop().create_future()
        self.results: list[Outcome] = [_PENDING] * count
        self.remaining = count
        if count == 0:
            self.future.set_result([])

    def settle(self, index: int, outcome: Outcome) -> None:
        self.results[index] = outcome
        self.remaining -= 1
        if self.remaining == 0 and not self.future.done():
            self.future.set_result(self.results)


_PENDING = errors.Unavailable("not sent yet")


@dataclasses.dataclass(slots=True)
class Item:
    """One message on its way: stamped properties, size, where its outcome goes."""

    message: Message
    properties: Mapping[str, str]
    size: int
    group: Group
    index: int
    deadline: float
