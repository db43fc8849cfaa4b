"""The Pulsar writer's link: an ``ExclusiveWithFencing`` producer without batching.

A new owner's producer fences the old one: the broker bumps the topic epoch
and the old producer's sends fail with ``ProducerFenced``. The term rule, the
reacquire loop (a writer that lost the topic to a lower term takes it back and
resends what was not stored) and group commit on top are the toolkit's
(:class:`headrace.wal.brokers.writer.BrokerWriter`). A record in flight when
a new producer takes the topic may be stored before the new fence record
without the opener's look at the end having seen it, so the link reads that
range back (:meth:`PulsarLink.stored`) and the writer yields to a higher term
found there.

Sends of one group go out pipelined with ``send_async``, at most
:data:`SEND_WINDOW` unanswered at a time (so the client's queue never fills),
and stop at the first failure: a fence ends an append of any size at once.

**Each record is stored once** (broker deduplication). When a connection is
lost with sends on the wire (a stalled broker, a broker closing it), the
client resends the unacknowledged messages on a new connection, although the
broker may have stored them already. The broker drops such a copy when it
deduplicates the topic: its key is the producer name and the sequence id. So
each writer's producer has a name of its own (:func:`producer_name`: the
pchannel, the term and a random part, so no other writer, of this term or any
other, shares its sequence space), and every message gets an explicit
sequence id, increasing across the link's producers (a new producer of the
same name continues after the broker's last one, ``last_sequence_id()``).
The broker answers a dropped copy with the id ``-1:-1``; the stored copy is
then the one of the link's own messages that the send's records are (in
order, they are its last ones: the broker stores a producer's messages in
sequence order), read back from the topic (:func:`.client.read_own_last`).
Every take checks that the broker deduplicates: the fence record is sent a
second time under its sequence id, and that copy must come back as a
duplicate (settings ``deduplication``: refuse, or warn).

When the producer is lost in the middle of a send, the broker may have
stored records whose receipts were lost with it. The writer takes the topic
back and would send them again under new sequence ids (above its new fence
record's): the new producer of the same name learns the broker's last
sequence id for it, so the link knows how many of them are stored, reads
them back and hands their ids to the writer (:meth:`PulsarLink.recovered`).

Each writer has a client (so a TCP connection) of its own. When a producer is
fenced while its sends are on the wire, the broker closes that producer's
whole connection, and the client resends the unacknowledged messages of every
other producer on it. A connection per writer keeps one pchannel's handoff
from disturbing the others.
"""

from __future__ import annotations

import dataclasses
import enum
import secrets
import threading
from collections.abc import Sequence
from typing import Any

import pulsar

from headrace import errors
from headrace.wal.brokers.contract import EMPTY, End, Lost, end_of
from headrace.wal.brokers.stamps import Kind
from headrace.wal.pulsar import client
from headrace.wal.pulsar.fencing import PulsarStamp, properties
from headrace.wal.pulsar.message_id import PulsarMessageID
from headrace.wal.pulsar.settings import PulsarSettings

FIRST_SEQUENCE_ID = 1
"""The client takes a sequence id of 0 for "none given" and numbers the message itself."""


MAX_PENDING = 2000
"""Sends the client queues for a producer (``max_pending_messages``)."""

SEND_WINDOW = MAX_PENDING // 2
"""Sends a link keeps unanswered at most, well below :data:`MAX_PENDING`, so
``send_async`` never waits for room in the client's queue. A send waiting for
room when the broker fences the producer gets queued after the client failed
the pending ones, and is never answered (pulsar-client 3.13): an append of
more records than the queue holds would hang past the send timeout."""


def producer_options(settings: PulsarSettings) -> dict[str, Any]:
    """Keyword arguments of ``create_producer`` besides the access mode: no batching.

    The link never fills the queue (:data:`SEND_WINDOW`); blocking when it is
    full is for the raw producer of :mod:`headrace.bench.broker`."""
    return {
        "batching_enabled": False,
        "block_if_queue_full": True,
        "max_pending_messages": MAX_PENDING,
        "send_timeout_millis": settings.send_timeout_ms,
    }


class Turn(enum.Enum):
    """What a link does before its next send (:func:`next_turn`)."""

    SEND = "send now: room in the window"
    WAIT = f"wait for an answer: {SEND_WINDOW} sends are unanswered"
    STOP = "send nothing more: a send failed (a fenced or failing producer)"


def next_turn(unanswered: int, failed: bool) -> Turn:
    """What a link does before sending its next record, with ``unanswered`` sends
    out and ``failed`` whether one failed (pure)."""
    if failed:
        return Turn.STOP
    return Turn.SEND if unanswered < SEND_WINDOW else Turn.WAIT


def producer_name(pchannel: str, term: int) -> str:
    """A name no other producer of the topic has: the key of its deduplication."""
    return f"headrace.{pchannel}.t{term}.{secrets.token_hex(6)}"


def next_sequence_id(planned: int, broker_last: int) -> int:
    """The next sequence id of a link: above every id it used and the broker's last
    for its name (a new producer of the name), never below :data:`FIRST_SEQUENCE_ID`
    (pure)."""
    return max(planned, broker_last + 1, FIRST_SEQUENCE_ID)


def stored_count(first_seq: int, count: int, broker_last: int) -> int:
    """How many of ``count`` records sent under sequence ids from ``first_seq`` on the
    broker stored, given the last id it stored for the producer name (pure)."""
    return max(0, min(count, broker_last - first_seq + 1))


@dataclasses.dataclass(frozen=True)
class _Unsettled:
    """The unacknowledged rest of a send lost with its producer."""

    records: tuple[bytes, ...]
    props: dict[str, str]
    first_seq: int
    after: PulsarMessageID | None
    """The link's floor when the send was lost: its records lie after it."""
    stored: tuple[PulsarMessageID, ...] | None = None
    """The ids of the leading records found stored, once the link took the topic back."""


def is_duplicate_receipt(mid: Any) -> bool:
    """Whether a send's receipt says the broker dropped the message as a copy of one
    it stored before (the id ``-1:-1``)."""
    return bool(mid.ledger_id() < 0)


class _Sends:
    """Results of pipelined sends, in send order (callbacks run on client threads).

    ``acked`` holds the id of each acknowledged message, None for a copy the
    broker dropped as a duplicate (stored before, id unknown). Sending stops
    at the first failure; the records not sent by then count as not written."""

    def __init__(self) -> None:
        self.acked: list[PulsarMessageID | None] = []
        self.failure: Any = None
        self.sent = 0
        self._answered = 0
        self._changed = threading.Condition()

    def done(self, result: Any, message_id: Any) -> None:
        with self._changed:
            if result == pulsar.Result.Ok and self.failure is None:
                duplicate = is_duplicate_receipt(message_id)
                self.acked.append(None if duplicate else client.from_pulsar(message_id))
            elif self.failure is None:
                self.failure = result
            self._answered += 1
            self._changed.notify_all()

    def turn(self, timeout: float) -> Turn:
        """:func:`next_turn`, waiting up to ``timeout`` for an answer while it says
        :attr:`Turn.WAIT` (still WAIT: no answer came in that time). On
        :attr:`Turn.SEND` the next record counts as sent (before ``send_async``:
        its answer may come first)."""
        with self._changed:
            turn = self._turn()
            if turn is Turn.WAIT:
                self._changed.wait_for(lambda: self._turn() is not Turn.WAIT, timeout)
                turn = self._turn()
            if turn is Turn.SEND:
                self.sent += 1
            return turn

    def _turn(self) -> Turn:
        return next_turn(self.sent - self._answered, self.failure is not None)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the answers to every record sent."""
        with self._changed:
            return self._changed.wait_for(lambda: self._answered == self.sent, timeout)


class PulsarLink:
    """A writer's hold on a pchannel's topic (a toolkit ``Link``)."""

    def __init__(self, settings: PulsarSettings, pchannel: str, term: int) -> None:
        self.pchannel = pchannel
        self.topic = settings.topic(pchannel)
        self.producer_name = producer_name(pchannel, term)
        self._settings = settings
        self._client = client.new_client(settings)
        self._producer: Any = None
        self._next_seq = FIRST_SEQUENCE_ID
        self._floor: PulsarMessageID | None = None
        """The last id this link saw at the topic's end or got acknowledged: every
        message its producers send later is stored after it."""
        self._unsettled: _Unsettled | None = None

    def look(self) -> End[PulsarMessageID]:
        last = client.read_last(self._client, self._settings, self.topic)
        if last is None:
            return EMPTY
        self._raise_floor(client.from_pulsar(last.message_id()))
        return end_of(client.from_pulsar(last.message_id()), client.stamp(last))

    def take(self) -> None:
        self.drop()
        try:
            self._producer = self._client.create_producer(
                self.topic,
                producer_name=self.producer_name,
                access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing,
                **producer_options(self._settings),
            )
            broker_last = self._producer.last_sequence_id()
            self._next_seq = next_sequence_id(self._next_seq, broker_last)
            self._find_unsettled(broker_last)
        except pulsar.PulsarException as exc:
            raise client.translate(exc, f"taking {self.topic}", self._settings) from None

    def _find_unsettled(self, broker_last: int) -> None:
        """Read back which records of the send lost with the previous producer the
        broker stored: before anything of the new producer, the last ones of the name."""
        lost = self._unsettled
        if lost is None or lost.stored is not None:
            return
        count = stored_count(lost.first_seq, len(lost.records), broker_last)
        found = self._own_last(lost.after, count) if count else []
        ids: list[PulsarMessageID] = []
        for message, data in zip(found, lost.records, strict=False):
            if message.data() != data or message.properties() != lost.props:
                break
            ids.append(client.from_pulsar(message.message_id()))
        self._unsettled = dataclasses.replace(lost, stored=tuple(ids))

    def recovered(self, records: Sequence[bytes]) -> list[PulsarMessageID]:
        lost, self._unsettled = self._unsettled, None
        if lost is None or not lost.stored:
            return []
        ids: list[PulsarMessageID] = []
        for mid, data, sent in zip(lost.stored, records, lost.records, strict=False):
            if data != sent:
                break
            ids.append(mid)
        return ids

    def held(self) -> bool:
        return self._producer is not None

    def send(self, records: Sequence[bytes], stamp: PulsarStamp) -> list[PulsarMessageID]:
        """Send ``records`` pipelined; a prefix of them may be stored when it fails.

        After a fence record (a take), the check that the broker deduplicates."""
        props = properties(stamp)
        first = self._next_seq
        self._next_seq += len(records)
        ids = self._settle(records, props, first, self._dispatch(records, props, first))
        if stamp.kind is Kind.FENCE and records:
            self._check_deduplication(records[-1], props, first + len(records) - 1)
        return ids

    def stored(
        self, after: PulsarMessageID | None, until: PulsarMessageID
    ) -> Sequence[tuple[PulsarMessageID, PulsarStamp]]:
        return client.read_stamps(self._client, self._settings, self.topic, after, until)

    def _raise_floor(self, mid: PulsarMessageID) -> None:
        if self._floor is None or mid > self._floor:
            self._floor = mid

    def _dispatch(self, batch: Sequence[bytes], props: dict[str, str], first: int) -> _Sends:
        """Send ``batch`` under sequence ids from ``first`` on, at most
        :data:`SEND_WINDOW` unanswered at a time, until one fails; wait for every
        answer. Each wait is bounded by the send timeout (and the operation
        timeout to learn of it): a broker that answers nothing in that time
        fails the append."""
        producer = self._producer
        sends = _Sends()
        bound = self._settings.send_timeout_ms / 1000 + self._settings.operation_timeout_s
        try:
            for offset, data in enumerate(batch):
                turn = sends.turn(bound)
                if turn is Turn.WAIT:
                    raise self._unanswered(sends)
                if turn is Turn.STOP:
                    break
                producer.send_async(data, sends.done, properties=props, sequence_id=first + offset)
        except pulsar.PulsarException as exc:
            self.drop()
            if isinstance(exc, pulsar.ProducerFenced | pulsar.AlreadyClosed):
                raise self._lost(batch, props, first, sends.acked) from None
            raise client.translate(exc, f"appending to {self.topic}", self._settings) from None
        if not sends.wait(bound):
            raise self._unanswered(sends)
        return sends

    def _unanswered(self, sends: _Sends) -> errors.Unavailable:
        """What an append whose sends the broker left unanswered raises (the
        producer dropped)."""
        self.drop()
        written = (
            "none of this append was acknowledged"
            if not sends.acked
            else f"its first {len(sends.acked)} records were acknowledged"
        )
        return errors.Unavailable(
            f"pulsar: sends to {self.topic} were not answered in time "
            f"({self._settings.service_url}); {written}"
        )

    def _settle(
        self, batch: Sequence[bytes], props: dict[str, str], first_seq: int, sends: _Sends
    ) -> list[PulsarMessageID]:
        """The ids of ``batch`` once every record was acknowledged, else the failure."""
        if sends.failure is None:
            ids = self._resolve(batch, props, sends.acked)
            if ids:
                self._raise_floor(ids[-1])
            return ids
        first = sends.failure
        if first == pulsar.Result.MessageTooBig:
            largest = max(map(len, batch))
            raise errors.MessageTooLarge(
                f"pulsar: a record ({largest} bytes at most) is larger than {self.topic} "
                f"accepts ({self._settings.service_url}); it was not written"
                + ("" if len(batch) == 1 else ", the other records of the call may have been")
            )
        self.drop()
        if first in (pulsar.Result.ProducerFenced, pulsar.Result.AlreadyClosed):
            raise self._lost(batch, props, first_seq, sends.acked)
        raise errors.Unavailable(
            f"pulsar: appending to {self.topic} failed with {first} "
            f"({self._settings.service_url}); a prefix of the records may have been written"
        )

    def _lost(
        self,
        batch: Sequence[bytes],
        props: dict[str, str],
        first_seq: int,
        acked: Sequence[PulsarMessageID | None],
    ) -> Lost | errors.Unavailable:
        """What a send lost with its producer raises: :class:`Lost` with the ids of
        its acknowledged records, the rest kept to be found at the next take.

        A failed send's records after its acknowledged ones may be stored too, so
        the stored copy of a duplicate among them cannot be told apart: then the
        send is not reported as lost (the writer would resend) but as failed."""
        known = [mid for mid in acked if mid is not None]
        if len(known) < len(acked):
            return errors.Unavailable(
                f"pulsar: {self.topic} was taken from this writer while it resent records the "
                f"broker had stored ({self._settings.service_url}); a prefix of the records "
                "may have been written"
            )
        self._unsettled = _Unsettled(
            tuple(batch[len(known) :]), props, first_seq + len(known), self._floor
        )
        return Lost(known)

    def _resolve(
        self, batch: Sequence[bytes], props: dict[str, str], acked: list[PulsarMessageID | None]
    ) -> list[PulsarMessageID]:
        """The ids of a send whose records were all acknowledged, finding the stored
        copy of each the broker dropped as a duplicate: the send's records are the
        last messages of this link's producer name."""
        if None not in acked:
            return [mid for mid in acked if mid is not None]
        found = self._own_last(self._floor, len(batch))
        ids = [client.from_pulsar(message.message_id()) for message in found]
        matches = len(found) == len(batch) and all(
            message.data() == data
            and message.properties() == props
            and (mid is None or mid == stored)
            for message, data, mid, stored in zip(found, batch, acked, ids, strict=False)
        )
        if not matches:
            raise errors.Unavailable(
                f"pulsar: the broker took records sent to {self.topic} for copies of stored "
                f"ones, which were not found after {self._floor} "
                f"({self._settings.service_url}); the records may have been written"
            )
        return ids

    def _own_last(self, after: PulsarMessageID | None, count: int) -> list[pulsar.Message]:
        return client.read_own_last(
            self._client,
            self._settings,
            self.topic,
            after=after,
            producer_name=self.producer_name,
            count=count,
        )

    def _check_deduplication(self, record: bytes, props: dict[str, str], seq: int) -> None:
        """Send ``record`` (just acknowledged under ``seq``) once more under ``seq``:
        a broker that deduplicates the topic drops the copy."""
        sends = self._dispatch([record], props, seq)
        if sends.failure is not None:
            self._settle([record], props, seq, sends)
        if sends.acked == [None]:
            return
        what = (
            f"pulsar: the broker does not deduplicate {self.topic} "
            f"({self._settings.service_url}), so a record the client resends after a lost "
            "connection can be stored twice; enable it with brokerDeduplicationEnabled=true "
            "in the broker configuration or `pulsar-admin namespaces set-deduplication "
            f"{self._settings.tenant}/{self._settings.namespace} --enable`"
        )
        if self._settings.deduplication == "warn":
            client.LOG.warning("%s (writing on: deduplication=warn)", what)
            return
        self.drop()
        raise errors.Unavailable(
            f"{what} (or set deduplication=warn to write without it)", retryable=False
        )

    def drop(self) -> None:
        producer, self._producer = self._producer, None
        client.close_quietly(producer, f"a lost producer of {self.topic}")

    def release(self) -> None:
        self.drop()
        client.close_quietly(self._client, f"the client of {self.topic}")
