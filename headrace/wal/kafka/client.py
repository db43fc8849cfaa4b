"""Blocking confluent-kafka calls of the backend, with errors translated.

Every function here blocks and runs in an executor thread, never on the event
loop. Library errors leave this module as :mod:`headrace.errors` types that
name the bootstrap address.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from headrace import errors
from headrace.wal.brokers.contract import Boundary
from headrace.wal.brokers.stamps import Kind
from headrace.wal.kafka.fencing import Admission, Headers, KafkaStamp, Placed, placed_of
from headrace.wal.kafka.message_id import KafkaMessageID
from headrace.wal.kafka.settings import KafkaSettings

LOG = logging.getLogger("headrace.wal.kafka")
_EXPECTED_WARNINGS = frozenset(
    {
        # The chained producer's enable.gapless.guarantee (settings.py), on purpose:
        # librdkafka warns about it each time such a producer is made.
        ("CONFWARN", "Configuration property enable.gapless.guarantee is experimental"),
    }
)
_POLL_S = 0.25
_FENCED_CODES = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)
_TOO_LARGE_CODES = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
_DENIED_CODES = frozenset(
    {
        KafkaError._AUTHENTICATION,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
    }
)
_UNREACHABLE_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError.REQUEST_TIMED_OUT,
    }
)
_INVALID_CODES = frozenset(
    {KafkaError._INVALID_ARG, KafkaError.INVALID_CONFIG, KafkaError.TOPIC_EXCEPTION}
)


def kafka_error(exc: BaseException) -> KafkaError | None:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def is_fenced(err: KafkaError | None) -> bool:
    return err is not None and err.code() in _FENCED_CODES


def translate(err: KafkaError, what: str, settings: KafkaSettings) -> errors.HeadraceError:
    """The Headrace error for a librdkafka error met while doing ``what``."""
    text = f"kafka {what} (bootstrap {settings.bootstrap_servers}): {err.str()}"
    code = err.code()
    if code in _FENCED_CODES:
        return errors.Fenced(text)
    if code in _TOO_LARGE_CODES:
        return errors.MessageTooLarge(text)
    if code in _INVALID_CODES:
        return errors.InvalidArgument(text)
    if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
        return errors.Truncated(text)
    if code in _DENIED_CODES:
        return errors.Unavailable(text, retryable=False)
    if code in _UNREACHABLE_CODES:
        return errors.Unavailable(f"{text} (is the broker running and reachable?)")
    return errors.Unavailable(text)


def translate_exception(
    exc: BaseException, what: str, settings: KafkaSettings
) -> errors.HeadraceError:
    err = kafka_error(exc)
    if err is not None:
        return translate(err, what, settings)
    if isinstance(exc, BufferError):
        return errors.Unavailable(f"kafka {what}: the producer queue is full: {exc}")
    if isinstance(exc, errors.HeadraceError):
        return exc
    return errors.Unavailable(
        f"kafka {what} (bootstrap {settings.bootstrap_servers}) failed: {exc!r}"
    )


def produce(
    producer: Producer,
    topic: str,
    data: bytes,
    headers: Headers,
    on_delivery: Callable[[KafkaError | None, Message], None],
) -> None:
    """Produce one record to partition 0, serving delivery reports while the
    producer's queue is full."""
    while True:
        try:
            producer.produce(topic, data, partition=0, headers=headers, on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(0.05)


def boundary(settings: KafkaSettings) -> Boundary:
    """Where the backend's client calls return: librdkafka errors are translated there."""

    def translate(exc: BaseException, what: str) -> errors.HeadraceError:
        return translate_exception(exc, what, settings)

    return Boundary("kafka", (KafkaException, BufferError), translate)


def new_admin(settings: KafkaSettings) -> AdminClient:
    return AdminClient(client_config_with_logger(settings.base_config()))


def ensure_topic(admin: AdminClient, settings: KafkaSettings, topic: str) -> None:
    """Create ``topic`` (one partition) if it is missing."""
    timeout = settings.operation_timeout_s
    try:
        if topic in admin.list_topics(topic=topic, timeout=timeout).topics and _has_partition(
            admin, topic, timeout
        ):
            return
        new = NewTopic(
            topic,
            num_partitions=1,
            replication_factor=settings.replication_factor,
            config=settings.topic_config(),
        )
        future = admin.create_topics([new], operation_timeout=timeout)[topic]
        future.result(timeout=timeout)
    except KafkaException as exc:
        err = kafka_error(exc)
        if err is None or err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise translate_exception(exc, f"creating topic {topic}", settings) from None
    _await_leader(admin, settings, topic)


def _has_partition(admin: AdminClient, topic: str, timeout: float) -> bool:
    meta = admin.list_topics(topic=topic, timeout=timeout).topics.get(topic)
    if meta is None or meta.error is not None or 0 not in meta.partitions:
        return False
    partition = meta.partitions[0]
    return partition.error is None and partition.leader >= 0


def _await_leader(admin: AdminClient, settings: KafkaSettings, topic: str) -> None:
    """Wait until the broker's metadata shows a leader for the new topic."""
    deadline = time.monotonic() + settings.operation_timeout_s
    while not _has_partition(admin, topic, settings.operation_timeout_s):
        if time.monotonic() > deadline:
            raise errors.Unavailable(
                f"kafka topic {topic} has no partition leader after "
                f"{settings.operation_timeout_s} s (bootstrap {settings.bootstrap_servers})"
            )
        time.sleep(0.05)


def delete_before(admin: AdminClient, settings: KafkaSettings, topic: str, offset: int) -> None:
    timeout = settings.operation_timeout_s
    try:
        futures = admin.delete_records(
            [TopicPartition(topic, 0, offset)], operation_timeout=timeout, request_timeout=timeout
        )
        for future in futures.values():
            future.result(timeout=timeout)
    except KafkaException as exc:
        raise translate_exception(exc, f"deleting records of {topic}", settings) from None


_TRANSIENT_CODES = frozenset(
    {
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
    }
)


def watermarks(consumer: Consumer, settings: KafkaSettings, topic: str) -> tuple[int, int]:
    """(log start offset, last stable offset) of partition 0, asked of the leader.

    Right after a topic is created a client's metadata may not know it yet:
    such errors are retried until the operation timeout.
    """
    deadline = time.monotonic() + settings.operation_timeout_s
    while True:
        left = max(deadline - time.monotonic(), 0.1)
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, 0), timeout=left, cached=False
            )
            return int(low), int(high)
        except KafkaException as exc:
            err = kafka_error(exc)
            transient = err is not None and err.code() in _TRANSIENT_CODES
            if not transient or time.monotonic() > deadline:
                raise translate_exception(exc, f"reading offsets of {topic}", settings) from None
        time.sleep(0.05)


def assign(consumer: Consumer, settings: KafkaSettings, topic: str, offset: int) -> None:
    """Assign partition 0 of ``topic`` from ``offset``, absolute or logical.

    librdkafka resolves a logical offset (the log start) by asking the
    partition's leader; assigned before the client knows the leader, the query
    is retried only after 500 ms. Asking for the topic's metadata first makes
    the leader known, so the query goes out at once.
    """
    if offset < 0:
        consumer.list_topics(topic, timeout=settings.operation_timeout_s)
    consumer.assign([TopicPartition(topic, 0, offset)])


def consume_ready(consumer: Consumer, max_records: int, wait_s: float) -> list[Message]:
    """Up to ``max_records`` messages: waits at most ``wait_s`` for the first, then
    takes only what the client already holds.

    ``Consumer.consume(n, timeout)`` returns when it holds ``n`` messages or the
    timeout passed, so asking it for a whole batch would keep the records that
    came (fewer than ``n``: the tail, the end of a scan) until the wait is over.
    """
    first = consumer.consume(1, wait_s)
    if not first or max_records <= 1:
        return first
    return first + consumer.consume(max_records - 1, 0)


@dataclasses.dataclass(frozen=True, slots=True)
class Found:
    offset: int
    placed: Placed
    value: bytes

    @property
    def stamp(self) -> KafkaStamp:
        return self.placed.stamp


def admitted(found: Iterator[Found]) -> Iterator[Found]:
    """The records of ``found`` (in offset order) that count (:class:`Admission`)."""
    admission = Admission()
    for record in found:
        admission, counts = admission.after(record.offset, record.placed)
        if counts:
            yield record


class Scan:
    """A short-lived read_committed consumer of partition 0 that reports EOF."""

    def __init__(self, settings: KafkaSettings, topic: str) -> None:
        self.settings = settings
        self.topic = topic
        self.consumer = Consumer(client_config_with_logger(settings.consumer_config(eof=True)))

    def close(self) -> None:
        self.consumer.close()

    def watermarks(self) -> tuple[int, int]:
        """(log start offset, last stable offset); waits out metadata lag."""
        return watermarks(self.consumer, self.settings, self.topic)

    def records(self, start: int) -> Iterator[Found]:
        """Committed records from ``start`` up to the end seen by the broker."""
        self.consumer.assign([TopicPartition(self.topic, 0, start)])
        deadline = time.monotonic() + self.settings.operation_timeout_s
        while True:
            if time.monotonic() > deadline:
                raise errors.Unavailable(
                    f"kafka: reading {self.topic} from offset {start} did not reach its end "
                    f"within {self.settings.operation_timeout_s} s "
                    f"(bootstrap {self.settings.bootstrap_servers})"
                )
            for msg in consume_ready(self.consumer, 500, _POLL_S):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return
                    raise translate(err, f"reading {self.topic}", self.settings)
                yield _found(msg)


def _found(msg: Message) -> Found:
    offset = msg.offset()
    assert offset is not None
    return Found(offset, placed_of(msg.headers()), msg.value() or b"")


@dataclasses.dataclass(frozen=True, slots=True)
class Tail:
    """The topic's last committed record and the id of its last data record."""

    last: Found
    last_data: KafkaMessageID | None


def read_tail(settings: KafkaSettings, topic: str) -> Tail | None:
    """Last committed record (data or fence) that counts, or None if there is none.

    Records that do not count (:class:`Admission`: a fenced writer's late
    records) are passed over, reading further back until one counts. When the
    last one is a fence record, its last data record is the last data record
    that counts before it (:func:`_last_data_before`), not its pointer alone."""
    scan = Scan(settings, topic)
    try:
        low, high = scan.watermarks()
        window = 8
        while high > low:
            start = max(low, high - window)
            last: Found | None = None
            last_data: int | None = None
            for found in admitted(scan.records(start)):
                last = found
                last_data = found.offset if found.stamp.kind is Kind.DATA else last_data
            if last is not None:
                if last_data == last.offset:
                    return Tail(last, KafkaMessageID(last.offset))
                seen = _Seen(start, None if last_data is None else KafkaMessageID(last_data))
                return Tail(last, _last_data_before(scan, last.stamp.prev, seen, low))
            if start == low:
                return None
            window *= 8
        return None
    finally:
        scan.close()


@dataclasses.dataclass(frozen=True, slots=True)
class _Seen:
    """What a read of the records from ``start`` up to a fence record found."""

    start: int
    last_data: KafkaMessageID | None
    """The last data record that counts among them."""


def _last_data_before(
    scan: Scan, pointer: KafkaMessageID | None, seen: _Seen, low: int
) -> KafkaMessageID | None:
    """The last data record that counts before a fence record whose pointer is ``pointer``.

    The pointer is the last data record its writer saw when it looked, just
    before writing it; a chained record in flight then (an append that failed
    with its delivery unknown) can land in its place after that look and
    before the fence record, and counts. So the records between the pointer
    and the fence record are read too (those from ``seen.start`` on were).
    """
    if seen.last_data is not None:
        if pointer is None or seen.last_data.offset > pointer.offset:
            return seen.last_data
        return pointer
    first = low if pointer is None else max(pointer.offset + 1, low)
    last = pointer
    if first < seen.start:
        for found in admitted(scan.records(first)):
            if found.offset >= seen.start:
                break
            if found.stamp.kind is Kind.DATA:
                last = KafkaMessageID(found.offset)
    return last


def read_one(settings: KafkaSettings, topic: str, offset: int) -> Found | None:
    """The committed record at exactly ``offset``, if it is still there."""
    scan = Scan(settings, topic)
    try:
        low, high = scan.watermarks()
        if not low <= offset < high:
            return None
        for found in scan.records(offset):
            return found if found.offset == offset else None
        return None
    finally:
        scan.close()


def read_range(
    settings: KafkaSettings, topic: str, start: int | None, until: int
) -> list[tuple[KafkaMessageID, KafkaStamp]]:
    """The stamps of the records that count from ``start`` (the log start when None)
    up to before ``until``."""
    scan = Scan(settings, topic)
    try:
        low, high = scan.watermarks()
        first = low if start is None else max(start, low)
        if first >= min(until, high):
            return []
        found: list[tuple[KafkaMessageID, KafkaStamp]] = []
        for record in admitted(scan.records(first)):
            if record.offset >= until:
                break
            found.append((KafkaMessageID(record.offset), record.stamp))
        return found
    finally:
        scan.close()


def first_data(settings: KafkaSettings, topic: str) -> Found | None:
    """The first committed data record still in the topic."""
    scan = Scan(settings, topic)
    try:
        low, high = scan.watermarks()
        if high <= low:
            return None
        for found in admitted(scan.records(low)):
            if found.stamp.kind is Kind.DATA:
                return found
        return None
    finally:
        scan.close()


def library_level(level: int, args: tuple[object, ...]) -> int:
    """The level a librdkafka log line is logged at (pure): a warning the backend
    expects (:data:`_EXPECTED_WARNINGS`, about a setting it makes on purpose) is
    DEBUG; any other line keeps its level. ``args`` are the line's facility,
    client name and text, as the client passes them to its ``logger``."""
    if level != logging.WARNING or len(args) != 3:
        return level
    facility, _, text = args
    for expected, start in _EXPECTED_WARNINGS:
        if facility == expected and isinstance(text, str) and start in text:
            return logging.DEBUG
    return level


class _LibraryLog:
    """The clients' ``logger``: their lines go to :data:`LOG` at :func:`library_level`."""

    def log(self, level: int, msg: str, *args: object) -> None:
        LOG.log(library_level(level, args), msg, *args)


LIBRARY_LOG = _LibraryLog()


def client_config_with_logger(config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "logger": LIBRARY_LOG}
