"""The chained Kafka link: fencing without a transaction per append (message format 2 logs).

A chained writer's producer is idempotent (``acks=all``) but not
transactional. Its fence record's delivery report gives the offset it landed
at; from then on every data record names, in its header, the offset it must
land at: right after the writer's previous record
(:func:`~headrace.wal.kafka.fencing.chained_header`). Records of one producer
to one partition land in produce order, also when they are pipelined and
retried (idempotence), and the producer stops rather than leave a gap
(:meth:`~headrace.wal.kafka.settings.KafkaSettings.idempotent_producer_config`),
so the writer's records are contiguous unless another producer's record came
between them. The delivery reports are checked in
order (:func:`settle`):

* every record where it must be: the send's ids are acknowledged;
* a record elsewhere: another writer (a newer term's fence record, most
  likely) wrote in between. The records before it are acknowledged; it and
  the rest of the send never are, and readers skip them, as they skip every
  record that is not where it names
  (:class:`~headrace.wal.kafka.fencing.Admission`). The link raises
  :class:`~headrace.wal.brokers.contract.Lost` and the toolkit's writer looks
  at the topic: a higher term (or its own term by another writer) fences it
  for good, anything else (a stale lower-term opener) makes it take the topic
  back with a new fence record and send the rest again;
* a failed or missing delivery report: whether that record (and the ones
  after it) is stored is unknown, so nothing from there on is acknowledged.
  The producer is purged and dropped, the append fails ``Unavailable``, and
  the next append takes the topic again behind a new fence record.

Readers also skip data of a lower term than the last fence record they read,
and of that fence record's term by another writer, so a record that a fenced
writer got acknowledged is one that landed before the newer fence record.

Taking the topic first fences the topic's transactional producer (the
writer of a format 1 log, or of the release before: ``init_transactions``
bumps its epoch and settles its open transaction), so at the cluster's switch
to message format 2 no transactional writer can still commit behind the
chained writer's fence record. A writer of a lower term that opens late can
still land its fence record after a newer one; it reads back what lies before
its own (:meth:`ChainLink.stored`) and yields (the toolkit's
:func:`~headrace.wal.brokers.stamps.overtaken`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from headrace import errors
from headrace.wal.brokers.contract import End, Lost
from headrace.wal.brokers.stamps import Kind
from headrace.wal.kafka import client
from headrace.wal.kafka.fencing import KafkaStamp, chained_header, header
from headrace.wal.kafka.message_id import KafkaMessageID
from headrace.wal.kafka.settings import KafkaSettings
from headrace.wal.kafka.writer import producer_config, topic_end


class Verdict(enum.Enum):
    STORED = "every record landed where it must"
    DISPLACED = "a record landed after another writer's"
    UNKNOWN = "a record's delivery is unknown"


@dataclasses.dataclass(frozen=True, slots=True)
class Settled:
    """What the delivery reports of one send tell (:func:`settle`)."""

    offsets: list[int]
    """The offsets of the leading records that are acknowledged."""
    verdict: Verdict
    detail: str = ""


def settle(expected: int | None, count: int, reports: Sequence[tuple[int | None, str]]) -> Settled:
    """Judge one send of ``count`` records from its delivery reports, in produce order (pure).

    ``expected`` is the offset the first record must land at (None for a
    fence record, which starts the chain wherever it lands); each report is
    ``(offset, "")`` or ``(None, error text)``. Only records that landed
    right after the previous one count as acknowledged.
    """
    offsets: list[int] = []
    for offset, failure in reports[:count]:
        if offset is None:
            return Settled(offsets, Verdict.UNKNOWN, failure)
        must = expected if not offsets else offsets[-1] + 1
        if must is not None and offset != must:
            detail = f"offset {offset}, not {must}"
            return Settled(offsets, Verdict.DISPLACED, detail)
        offsets.append(offset)
    if len(offsets) < count:
        return Settled(offsets, Verdict.UNKNOWN, f"{count - len(offsets)} delivery reports missing")
    return Settled(offsets, Verdict.STORED)


class _Reports:
    """Delivery reports of one send, in produce order (one partition)."""

    def __init__(self) -> None:
        self._reports: list[tuple[int | None, KafkaError | None]] = []

    def delivered(self, err: KafkaError | None, msg: Message) -> None:
        # A failed report is taken as it is: after a fatal error (a gap the
        # producer refused to make) the message's accessors raise.
        self._reports.append((None, err) if err is not None else (msg.offset(), None))

    @property
    def reports(self) -> list[tuple[int | None, str]]:
        """``(offset, "")`` or ``(None, why it failed)`` per report (:func:`settle`)."""
        return [
            (offset, "")
            if err is None and offset is not None and offset >= 0
            else (None, "no offset" if err is None else err.str())
            for offset, err in self._reports
        ]


HEADER_ROOM = 128
"""Bytes a record's framing may add to its data, for the size check: the broker
checks a record batch against the topic's ``max.message.bytes``, so its header
(61 bytes), the record's own fields (up to 5 varints of up to 5 bytes, one of up
to 10) and the stamp header (8 + 26 bytes and their lengths) count: 106 bytes
measured for one record of 2 KB. A record let through and then refused by the
broker would fail its append ``Unavailable`` (retried in vain) rather than
``MessageTooLarge``."""


def too_large(records: Sequence[bytes], limit: int) -> int | None:
    """The size of the first record too large to send under ``limit``, else None (pure)."""
    for data in records:
        if len(data) + HEADER_ROOM > limit:
            return len(data)
    return None


def fence_transactions(settings: KafkaSettings, topic: str) -> None:
    """Fence the topic's transactional producer (bump its epoch, settle its transaction)."""
    producer = Producer(producer_config(settings, topic))
    try:
        producer.init_transactions(settings.operation_timeout_s)
    except KafkaException as exc:
        raise client.translate_exception(
            exc, f"fencing the transactional writer of {topic}", settings
        ) from None
    finally:
        producer.flush(0)


def chained_producer(settings: KafkaSettings) -> Producer:
    """A new chained writer's producer (idempotent, gap-less, not transactional)."""
    return Producer(client.client_config_with_logger(settings.idempotent_producer_config()))


def _library_error(exc: BaseException) -> KafkaException | None:
    """The library error ``exc`` is, or was caused by; None for anything else.

    confluent-kafka raises a fatal error (the producer refusing to leave a gap
    in its records) from inside ``flush`` and leaves it pending while the
    callbacks still due in that call run; their first call into C then fails
    with a :class:`SystemError` caused by it."""
    if isinstance(exc, KafkaException):
        return exc
    cause = exc.__cause__
    return cause if isinstance(exc, SystemError) and isinstance(cause, KafkaException) else None


def unfenced(failure: errors.HeadraceError) -> errors.HeadraceError:
    """``failure`` of the chained producer, a fenced epoch made retryable (pure).

    The producer has no transactional id, so no other writer can fence its
    epoch: the client's own epoch trouble says nothing about terms. Only the
    look at the topic when the writer takes it again decides whether a higher
    term holds it (raising Fenced, which the writer keeps for good)."""
    if not isinstance(failure, errors.Fenced):
        return failure
    return errors.Unavailable(
        f"{failure.message}; the chained producer is dropped, and the next append takes "
        "the topic again if no higher term holds it"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Unsettled:
    """The records of a data send whose delivery is unknown, kept until the next take."""

    first: int
    """The offset the first of ``records`` had to land at."""
    records: Sequence[bytes]
    term: int
    nonce: int

    def holds(self, i: int, offset: int, found: KafkaStamp) -> bool:
        """Whether the record read back at ``offset`` is ``records[i]`` (pure): in
        its place, and data of this writer (term and nonce)."""
        return (
            offset == self.first + i
            and found.kind is Kind.DATA
            and found.term == self.term
            and found.nonce == self.nonce
        )


class ChainLink:
    """A writer's hold on partition 0 of a pchannel's topic (a toolkit ``Link``)."""

    def __init__(self, settings: KafkaSettings, pchannel: str, topic: str) -> None:
        self.pchannel = pchannel
        self.topic = topic
        self._settings = settings
        self._producer: Producer | None = None
        self._next: int | None = None
        """The offset the next data record must land at; None before the fence record."""
        self._unsettled: _Unsettled | None = None
        """A data send whose delivery was unknown, until the next take settles it."""

    def look(self) -> End[KafkaMessageID]:
        return topic_end(self._settings, self.topic)

    def take(self) -> None:
        self.drop()
        fence_transactions(self._settings, self.topic)
        self._producer = chained_producer(self._settings)

    def held(self) -> bool:
        return self._producer is not None

    def send(self, records: Sequence[bytes], stamp: KafkaStamp) -> list[KafkaMessageID]:
        """Produce ``records`` pipelined; the ids of those confirmed in place."""
        producer = self._producer
        assert producer is not None
        fence = stamp.kind is Kind.FENCE
        expected = None if fence else self._next
        assert fence or expected is not None, "a data send before the writer's fence record"
        oversized = too_large(records, self._settings.max_message_bytes)
        if oversized is not None:
            raise errors.MessageTooLarge(
                f"kafka: a record of {oversized} bytes does not fit max_message_bytes "
                f"{self._settings.max_message_bytes} of {self.topic}; nothing was sent"
            )
        reports = _Reports()
        delivered = reports.delivered
        topic = self.topic
        try:
            for i, data in enumerate(records):
                headers = header(stamp) if expected is None else chained_header(stamp, expected + i)
                client.produce(producer, topic, data, headers, delivered)
            producer.flush(self._settings.operation_timeout_s)
        except (KafkaException, SystemError) as exc:
            library = _library_error(exc)
            if library is None:
                raise
            self.drop()
            raise unfenced(
                client.translate_exception(
                    library,
                    f"appending to {self.topic} (nothing was acknowledged; records produced "
                    "before the failure may be stored)",
                    self._settings,
                )
            ) from None
        settled = settle(expected, len(records), reports.reports)
        ids = [KafkaMessageID(offset) for offset in settled.offsets]
        if settled.verdict is Verdict.STORED:
            self._next = settled.offsets[-1] + 1 if settled.offsets else self._next
            return ids
        self.drop()
        if settled.verdict is Verdict.DISPLACED:
            raise Lost(ids, final=True)
        if expected is None:
            raise errors.Unavailable(
                f"kafka: the delivery of a fence record to {self.topic} is unknown "
                f"({settled.detail}); the writer takes the topic again"
            )
        rest = len(ids)
        self._unsettled = _Unsettled(expected + rest, records[rest:], stamp.term, stamp.nonce)
        raise Lost(ids, final=True, unsettled=True)

    def recovered(self, records: Sequence[bytes]) -> list[KafkaMessageID]:
        """After a take: the ids of the leading ``records`` of a send whose delivery
        was unknown (:class:`_Unsettled`) that landed in place before the take's
        fence record (so readers read them). Records of a displaced send after
        the displacement are never read: nothing for those."""
        lost, self._unsettled = self._unsettled, None
        if lost is None or self._next is None:
            return []
        count = 0
        for data, sent in zip(records, lost.records, strict=False):
            if data != sent:
                break
            count += 1
        if not count:
            return []
        fence_at = self._next - 1
        ids: list[KafkaMessageID] = []
        for mid, found in client.read_range(self._settings, self.topic, lost.first, fence_at):
            if len(ids) == count or not lost.holds(len(ids), mid.offset, found):
                break
            ids.append(mid)
        return ids

    def stored(
        self, after: KafkaMessageID | None, until: KafkaMessageID
    ) -> Sequence[tuple[KafkaMessageID, KafkaStamp]] | None:
        """The records that count after ``after`` and before ``until`` (a fence record)."""
        return client.read_range(
            self._settings, self.topic, None if after is None else after.offset + 1, until.offset
        )

    def drop(self) -> None:
        """Stop the producer: purge what it has not delivered, and let it go."""
        producer, self._producer = self._producer, None
        self._next = None
        if producer is not None:
            producer.purge()
            producer.flush(0)

    def release(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(self._settings.operation_timeout_s)
