"""What a producer and its lanes share: options, messages on their way, outcomes,
and the record batches (message format 2) a lane seals them into."""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import itertools
from collections.abc import Callable, Sequence

from headrace import errors, slots
from headrace.message import batch
from headrace.message.batch import BatchInfo, Limits
from headrace.message.properties import PRODUCER_ID, PRODUCER_SEQ
from headrace.message.types import (
    Message,
    payload_of,
    properties_of,
    txn_id_of,
    type_of,
    vchannel_of,
)
from headrace.wal.api import AppendResult
from headrace.wal.validation import goes_alone

Outcome = AppendResult | errors.HeadraceError
"""What one message comes to: its result once acknowledged, else its error."""


@dataclasses.dataclass(frozen=True, slots=True)
class ProducerOptions:
    max_batch_messages: int = 1024
    """Most messages in one request (and in one record batch): a burst of up
    to this many within ``max_batch_bytes`` is one append on the owner."""
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
    """The outcomes of one ``send``/``send_many`` call, filled an item (a run of
    messages) at a time."""

    __slots__ = ("future", "remaining", "results")

    def __init__(self, count: int) -> None:
        self.future: asyncio.Future[list[Outcome]] = asyncio.get_running_loop().create_future()
        self.results: list[Outcome] = [_PENDING] * count
        self.remaining = count
        if count == 0:
            self.future.set_result([])

    def settle(self, index: int, outcome: Outcome) -> None:
        """One message's outcome."""
        self.results[index] = outcome
        self._settled(1)

    def settle_run(
        self, indexes: Indexes, outcomes: Sequence[Outcome] | errors.HeadraceError
    ) -> None:
        """The outcomes of the messages at ``indexes``: one each, or one error for all."""
        each = [outcomes] * len(indexes) if isinstance(outcomes, errors.HeadraceError) else outcomes
        if len(indexes) == 1:
            self.results[indexes[0]] = each[0]
        elif isinstance(indexes, range):
            self.results[indexes.start : indexes.stop] = each
        else:
            results = self.results
            for index, outcome in zip(indexes, each, strict=True):
                results[index] = outcome
        self._settled(len(indexes))

    def _settled(self, count: int) -> None:
        self.remaining -= count
        if self.remaining == 0 and not self.future.done():
            self.future.set_result(self.results)


_PENDING = errors.Unavailable("not sent yet")

Indexes = range | list[int]
"""Where messages' outcomes go in their call's results (a range when contiguous)."""


@dataclasses.dataclass(slots=True)
class Item:
    """Messages of one call on their way, in their order, all of one vchannel
    and transaction: their dedup keys, sizes, where their outcomes go. A
    message that :func:`goes_alone` is an item of its own (``alone``)."""

    messages: list[Message]
    indexes: Indexes
    """Where each message's outcome goes in ``group``."""
    group: Group
    producer_id: str
    seq: int
    """With ``producer_id``, the first message's own dedup key (message ``i``
    has ``seq + i``): sent as its properties to an owner writing format 1
    (format 2 dedups whole batches instead)."""
    size: int
    """Bytes held of the producer's budget."""
    records: int
    """Bytes of the messages' records in a batch (as estimated)."""
    deadline: float
    alone: bool = False
    sent_one_by_one: bool = False
    """It was sent to an owner writing format 1, with its dedup properties: to
    a format 2 owner each message goes alone with them (see :func:`seal`)."""

    @property
    def vchannel(self) -> str:
        return self.messages[0].vchannel

    @property
    def txn_id(self) -> int:
        return self.messages[0].txn_id

    def stamped(self, i: int) -> Message:
        """Message ``i`` with its dedup key in its properties (built when asked:
        only a format 1 owner, or a message first sent to one, needs them)."""
        msg = self.messages[i]
        properties = dict(msg.properties)
        properties[PRODUCER_ID] = self.producer_id
        properties[PRODUCER_SEQ] = str(self.seq + i)
        return dataclasses.replace(msg, properties=properties)

    def part(self, start: int, stop: int) -> Item:
        """Messages ``start:stop`` as an item of their own (its budget share with them)."""
        messages = self.messages[start:stop]
        return Item(
            messages,
            self.indexes[start:stop],
            self.group,
            self.producer_id,
            self.seq + start,
            budget_size(messages),
            sum(map(record_size, messages)),
            self.deadline,
            self.alone,
            self.sent_one_by_one,
        )

    def singles(self) -> list[Item]:
        """Each message as an item of its own."""
        if len(self.messages) == 1:
            return [self]
        return [self.part(i, i + 1) for i in range(len(self.messages))]


_ITEM_OVERHEAD = 96
"""Bytes a message holds of a producer's budget besides its payload and vchannel."""


def budget_size(messages: Sequence[Message]) -> int:
    """Bytes that ``messages`` (of one vchannel) hold of a producer's budget."""
    return sum(map(len, map(payload_of, messages))) + len(messages) * (
        len(messages[0].vchannel) + _ITEM_OVERHEAD
    )


def record_size(msg: Message) -> int:
    """A message's record bytes in a batch (properties counted in characters)."""
    props = sum(6 + len(k) + len(v) for k, v in msg.properties.items())
    return batch.RECORD_HEADER_SIZE + len(msg.payload) + (2 + props if props else 0)


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """What the items of one ``send_many`` call share."""

    group: Group
    producer_id: str
    first_seq: int
    """The dedup sequence of the call's first message; the others follow, an
    item's messages in a row."""
    deadline: float


def items(
    messages: list[Message], indexes: Indexes, call: Call, options: ProducerOptions
) -> list[Item]:
    """``messages`` (checked; their outcomes go at ``indexes``) cut into items:
    per vchannel in order, an item ends where another transaction's message or
    one that :func:`goes_alone` comes, and stays within the producer's batch
    bounds. The common call, all of one vchannel and transaction, is cut
    without per-message work."""
    if not messages:
        return []
    plain = not any(map(properties_of, messages)) and not any(
        # One message per type is enough: without properties, the type decides.
        map(goes_alone, dict(zip(map(type_of, messages), messages, strict=True)).values())
    )
    if (
        plain
        and len(set(map(vchannel_of, messages))) == 1
        and len(set(map(txn_id_of, messages))) == 1
    ):
        found = _plain_items(messages, indexes, call, options)
        if found is not None:
            return found
    return _items(messages, indexes, call, options, plain=plain)


def _plain_items(
    messages: list[Message], indexes: Indexes, call: Call, options: ProducerOptions
) -> list[Item] | None:
    """Messages of one vchannel and transaction, none with properties nor
    going alone, cut as :func:`cuts` says; None if one message alone is over
    ``max_batch_bytes`` (then they are cut message by message)."""
    vchannel = messages[0].vchannel
    head, held = batch.HEADER_SIZE + len(vchannel), len(vchannel) + _ITEM_OVERHEAD
    lengths = list(map(len, map(payload_of, messages)))
    stops = cuts(lengths, options.max_batch_messages, options.max_batch_bytes - head)
    if stops is None:
        return None
    found: list[Item] = []
    for start, stop in itertools.pairwise([0, *stops]):
        payloads = sum(lengths[start:stop])
        found.append(
            Item(
                messages[start:stop],
                indexes[start:stop],
                call.group,
                call.producer_id,
                call.first_seq + start,
                payloads + held * (stop - start),
                payloads + batch.RECORD_HEADER_SIZE * (stop - start),
                call.deadline,
            )
        )
    return found


def cuts(lengths: list[int], most_messages: int, room: int) -> list[int] | None:
    """Where a run of records with payloads of ``lengths`` is cut into batches
    of at most ``most_messages`` records and ``room`` bytes of records (pure):
    the end of each batch, each as long as the bounds allow (what :func:`_items`
    does message by message, found here on the running sum of the records'
    sizes); None if one record alone is over ``room``."""
    count = len(lengths)
    if count <= most_messages and sum(lengths) + batch.RECORD_HEADER_SIZE * count <= room:
        return [count]  # the common call: one batch
    ends = list(itertools.accumulate(map(batch.RECORD_HEADER_SIZE.__add__, lengths), initial=0))
    stops: list[int] = []
    start = 0
    while start < count:
        stop = min(start + most_messages, bisect.bisect_right(ends, ends[start] + room) - 1)
        if stop <= start:
            return None
        stops.append(stop)
        start = stop
    return stops


def _items(
    messages: list[Message], indexes: Indexes, call: Call, options: ProducerOptions, *, plain: bool
) -> list[Item]:
    """:func:`items` message by message; ``plain``: no message has properties
    or goes alone."""
    group, producer_id, deadline = call.group, call.producer_id, call.deadline
    most_messages, most_bytes = options.max_batch_messages, options.max_batch_bytes
    built: list[Item] = []
    open_at: dict[str, Item] = {}
    for index, msg in zip(indexes, messages, strict=True):
        vchannel = msg.vchannel
        payload = len(msg.payload)
        size = batch.RECORD_HEADER_SIZE + payload if plain else record_size(msg)
        held = payload + len(vchannel) + _ITEM_OVERHEAD
        if not plain and goes_alone(msg):
            open_at.pop(vchannel, None)
            built.append(Item([msg], [index], group, producer_id, 0, held, size, deadline, True))
            continue
        item = open_at.get(vchannel)
        if (
            item is not None
            and isinstance(item.indexes, list)  # as built here
            and item.messages[0].txn_id == msg.txn_id
            and len(item.messages) < most_messages
            and batch.HEADER_SIZE + len(vchannel) + item.records + size <= most_bytes
        ):
            item.messages.append(msg)
            item.indexes.append(index)
            item.records += size
            item.size += held
            continue
        item = open_at[vchannel] = Item([msg], [index], group, producer_id, 0, held, size, deadline)
        built.append(item)
    seq = call.first_seq
    for item in built:
        item.seq = seq
        seq += len(item.messages)
    return built


@dataclasses.dataclass(frozen=True, slots=True, init=False)
class Sealed:
    """A record batch encoded once, with its messages: every retry sends these
    same bytes (the same producer id and sequence), so the WAL's dedup answers
    a repeat with the first result."""

    data: bytes
    items: tuple[Item, ...]
    count: int
    """Messages in the batch."""

    def __init__(self, data: bytes, items: tuple[Item, ...], count: int) -> None:
        # The slot descriptors' setters (one is made per batch: per message of
        # a call spread over many vchannels); see headrace.slots.
        _SET_SEALED_DATA(self, data)
        _SET_SEALED_ITEMS(self, items)
        _SET_SEALED_COUNT(self, count)

    @property
    def deadline(self) -> float:
        return min(item.deadline for item in self.items)


_SET_SEALED_DATA, _SET_SEALED_ITEMS, _SET_SEALED_COUNT = slots.setters(Sealed)


@dataclasses.dataclass(frozen=True, slots=True)
class Sealing:
    """How a lane seals messages: the producer's batch identity and the owner's bounds."""

    producer_id: int
    next_sequence: Callable[[], int]
    limits: Limits


def group(items: Sequence[Item], max_batch_bytes: int) -> list[list[Item]]:
    """``items`` in record batches (pure): one vchannel and transaction per
    batch, in order per vchannel (a batch of a vchannel ends where another
    transaction's item or one that goes alone comes); each message of an item
    that goes alone (or was sent one by one) gets its own; a batch stays under
    ``max_batch_bytes`` (as estimated), an item cut where it would not."""
    if _apart(items, max_batch_bytes):
        return [[item] for item in items]
    batches: list[list[Item]] = []
    sizes: list[int] = []
    open_at: dict[str, int] = {}
    for item in items:
        vchannel = item.messages[0].vchannel
        if item.alone or item.sent_one_by_one:
            open_at.pop(vchannel, None)
            for single in item.singles():
                batches.append([single])
                sizes.append(0)
            continue
        head = batch.HEADER_SIZE + len(vchannel)
        pieces = (
            [item] if head + item.records <= max_batch_bytes else _cut(item, max_batch_bytes - head)
        )
        for piece in pieces:
            at = open_at.get(vchannel)
            if (
                at is not None
                and batches[at][0].messages[0].txn_id == piece.messages[0].txn_id
                and sizes[at] + piece.records <= max_batch_bytes
            ):
                batches[at].append(piece)
                sizes[at] += piece.records
                continue
            open_at[vchannel] = len(batches)
            batches.append([piece])
            sizes.append(head + piece.records)
    return batches


def _apart(items: Sequence[Item], max_batch_bytes: int) -> bool:
    """Whether :func:`group` puts each of ``items`` in a batch of its own as it
    is (pure): each of another vchannel, none going alone nor sent one by one,
    each within the bound (items of a call spread over many vchannels)."""
    vchannels = [item.messages[0].vchannel for item in items]
    return (
        len(set(vchannels)) == len(items)
        and not any(item.alone or item.sent_one_by_one for item in items)
        and all(
            batch.HEADER_SIZE + len(vchannel) + item.records <= max_batch_bytes
            for vchannel, item in zip(vchannels, items, strict=True)
        )
    )


def _cut(item: Item, most: int) -> list[Item]:
    """``item`` cut into parts of at most ``most`` record bytes (a message
    larger than that is a part of its own: encoding fails it alone)."""
    parts: list[Item] = []
    start = total = 0
    for i, msg in enumerate(item.messages):
        size = record_size(msg)
        if i > start and total + size > most:
            parts.append(item.part(start, i))
            start, total = i, 0
        total += size
    parts.append(item.part(start, len(item.messages)))
    return parts


def seal(
    items: Sequence[Item], sealing: Sealing
) -> tuple[list[Sealed], list[tuple[Item, errors.HeadraceError]]]:
    """``items`` grouped (:func:`group`) and encoded, each batch with the next
    sequence; the items that cannot be encoded (a message too large, not
    UTF-8), with their errors. A batch that does not encode as a whole is
    encoded message by message, so one bad message fails alone. Runs of
    batches of one message (a call spread over many vchannels) are encoded
    in one pass (:func:`_seal_singles`)."""
    sealed: list[Sealed] = []
    failed: list[tuple[Item, errors.HeadraceError]] = []
    run: list[Item] = []
    for members in group(items, sealing.limits.max_batch_bytes):
        first = members[0]
        if len(members) == 1 and len(first.messages) == 1 and not first.sent_one_by_one:
            run.append(first)
            continue
        if run:
            _seal_singles(run, sealing, sealed, failed)
            run = []
        if first.sent_one_by_one:
            # Maybe written by a format 1 owner: deduplicated by its message's
            # properties, as then (a batch without a producer id).
            msg = first.stamped(0)
            try:
                data = batch.encode(
                    [msg], BatchInfo(msg.vchannel, 0, 0, msg.txn_id), sealing.limits
                )
            except errors.HeadraceError as exc:
                failed.append((first, exc))
                continue
            sealed.append(Sealed(data, (first,), 1))
            continue
        whole = _encoded(members, sealing, sealing.next_sequence())
        if isinstance(whole, Sealed):
            sealed.append(whole)
            continue
        for part in (part for member in members for part in member.singles()):
            alone = _encoded([part], sealing, sealing.next_sequence())
            if isinstance(alone, Sealed):
                sealed.append(alone)
            else:
                failed.append((part, alone))
    if run:
        _seal_singles(run, sealing, sealed, failed)
    return sealed, failed


def _seal_singles(
    run: list[Item],
    sealing: Sealing,
    sealed: list[Sealed],
    failed: list[tuple[Item, errors.HeadraceError]],
) -> None:
    """Seal items of one message each, each its own batch with the next
    sequence, in order: encoded in one pass
    (:func:`~headrace.message.batch.encode_singles`), those it leaves one by
    one (which builds them or names the fault)."""
    sequences = [sealing.next_sequence() for _ in run]
    built = batch.encode_singles(
        [item.messages[0] for item in run], sealing.producer_id, sequences, sealing.limits
    )
    for item, data, sequence in zip(run, built, sequences, strict=True):
        if data is not None:
            sealed.append(Sealed(data, (item,), 1))
            continue
        alone = _encoded([item], sealing, sequence)
        if isinstance(alone, Sealed):
            sealed.append(alone)
        else:
            failed.append((item, alone))


def _encoded(items: list[Item], sealing: Sealing, sequence: int) -> Sealed | errors.HeadraceError:
    """``items`` (of one vchannel and transaction) as one record batch with
    ``sequence``, or why they do not encode. A sequence taken by a batch that
    fails to encode is skipped: only uniqueness and order matter."""
    first = items[0]
    members: tuple[Item, ...]
    if len(items) == 1:
        messages, members = first.messages, (first,)
    else:
        messages, members = [msg for item in items for msg in item.messages], tuple(items)
    head = messages[0]
    info = BatchInfo(head.vchannel, sealing.producer_id, sequence, head.txn_id)
    try:
        data = batch.encode(messages, info, sealing.limits)
    except errors.HeadraceError as exc:
        return exc
    return Sealed(data, members, len(messages))
