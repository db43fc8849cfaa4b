"""What a producer and its lanes share: options, messages on their way, outcomes,
and the record batches (message format 2) a lane seals them into."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence

from headrace import errors
from headrace.message import batch
from headrace.message.batch import BatchInfo, Limits
from headrace.message.properties import PRODUCER_ID, PRODUCER_SEQ
from headrace.message.types import Message
from headrace.wal.api import AppendResult
from headrace.wal.validation import goes_alone

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
    producer_id: str | None = None
    """The producer's identity for deduplicating record batches (message
    format 2): a stable 8-byte hash of it, so a restarted client keeps it;
    None: a random one per producer."""

    def __post_init__(self) -> None:
        if self.producer_id is not None and (
            not isinstance(self.producer_id, str) or not self.producer_id
        ):
            raise errors.InvalidArgument(
                f"producer_id must be a non-empty string or None, got {self.producer_id!r}"
            )
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
    """One message on its way: its dedup key, size, where its outcome goes."""

    message: Message
    producer_id: str
    seq: int
    """With ``producer_id``, the message's own dedup key: sent as its properties
    to an owner writing format 1 (format 2 dedups whole batches instead)."""
    size: int
    group: Group
    index: int
    deadline: float
    sent_one_by_one: bool = False
    """It was sent to an owner writing format 1, with its dedup properties: to
    a format 2 owner it goes alone with them (see :func:`seal`)."""

    @property
    def properties(self) -> Mapping[str, str]:
        """The message's properties stamped with its dedup key (built when asked:
        only a format 1 owner, or a message first sent to one, needs them)."""
        stamped = dict(self.message.properties)
        stamped[PRODUCER_ID] = self.producer_id
        stamped[PRODUCER_SEQ] = str(self.seq)
        return stamped


@dataclasses.dataclass(frozen=True, slots=True)
class Sealed:
    """A record batch encoded once, with its messages: every retry sends these
    same bytes (the same producer id and sequence), so the WAL's dedup answers
    a repeat with the first result."""

    data: bytes
    items: tuple[Item, ...]

    @property
    def deadline(self) -> float:
        return min(item.deadline for item in self.items)


@dataclasses.dataclass(frozen=True, slots=True)
class Sealing:
    """How a lane seals messages: the producer's batch identity and the owner's bounds."""

    producer_id: int
    next_sequence: Callable[[], int]
    limits: Limits


def group(items: Sequence[Item], max_batch_bytes: int) -> list[list[Item]]:
    """``items`` in record batches (pure): one vchannel and transaction per
    batch, in order per vchannel (a batch of a vchannel ends where another
    transaction's message or one that goes alone comes); a message that
    :func:`goes_alone` gets its own; a batch stays under ``max_batch_bytes``
    (as estimated)."""
    batches: list[list[Item]] = []
    sizes: list[int] = []
    open_at: dict[str, int] = {}
    for item in items:
        msg = item.message
        vchannel = msg.vchannel
        if goes_alone(msg) or item.sent_one_by_one:
            open_at.pop(vchannel, None)
            batches.append([item])
            sizes.append(0)
            continue
        size = _estimate(msg)
        at = open_at.get(vchannel)
        if (
            at is not None
            and batches[at][0].message.txn_id == msg.txn_id
            and sizes[at] + size <= max_batch_bytes
        ):
            batches[at].append(item)
            sizes[at] += size
            continue
        open_at[vchannel] = len(batches)
        batches.append([item])
        sizes.append(batch.HEADER_SIZE + len(vchannel) + size)
    return batches


def _estimate(msg: Message) -> int:
    """A record's bytes in a batch (properties counted in characters)."""
    props = sum(6 + len(k) + len(v) for k, v in msg.properties.items())
    return batch.RECORD_HEADER_SIZE + len(msg.payload) + (2 + props if props else 0)


def seal(
    items: Sequence[Item], sealing: Sealing
) -> tuple[list[Sealed], list[tuple[Item, errors.HeadraceError]]]:
    """``items`` grouped (:func:`group`) and encoded, each batch with the next
    sequence; the messages that cannot be encoded (too large, not UTF-8), with
    their errors. A batch that does not encode as a whole is encoded message by
    message, so one bad message fails alone."""
    sealed: list[Sealed] = []
    failed: list[tuple[Item, errors.HeadraceError]] = []
    for members in group(items, sealing.limits.max_batch_bytes):
        if members[0].sent_one_by_one:
            # Maybe written by a format 1 owner: deduplicated by its message's
            # properties, as then (a batch without a producer id).
            item = members[0]
            msg = dataclasses.replace(item.message, properties=item.properties)
            try:
                data = batch.encode(
                    [msg], BatchInfo(msg.vchannel, 0, 0, msg.txn_id), sealing.limits
                )
            except errors.HeadraceError as exc:
                failed.append((item, exc))
                continue
            sealed.append(Sealed(data, (item,)))
            continue
        attempts = [members] if len(members) == 1 else [members, *([m] for m in members)]
        for attempt in attempts:
            first = attempt[0].message
            # A sequence a batch that fails to encode took is skipped: only
            # uniqueness and order matter.
            info = BatchInfo(
                first.vchannel, sealing.producer_id, sealing.next_sequence(), first.txn_id
            )
            try:
                data = batch.encode([item.message for item in attempt], info, sealing.limits)
            except errors.HeadraceError as exc:
                if len(attempt) == 1:
                    failed.append((attempt[0], exc))
                continue
            sealed.append(Sealed(data, tuple(attempt)))
            if attempt is members:
                break
    return sealed, failed
