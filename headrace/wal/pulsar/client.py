"""Blocking pulsar-client calls of the backend, with errors translated.

Every function here blocks and runs in an executor thread, never on the event
loop. Library errors leave this module as :mod:`headrace.errors` types that
name the service URL.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

import pulsar

from headrace import errors
from headrace.wal.brokers.contract import Boundary
from headrace.wal.brokers.stamps import Kind
from headrace.wal.pulsar.fencing import PulsarStamp, stamp_of
from headrace.wal.pulsar.message_id import PulsarMessageID
from headrace.wal.pulsar.settings import KEEP_SUBSCRIPTION, SUBSCRIPTION, PulsarSettings

LOG = logging.getLogger("headrace.wal.pulsar")
CLIENT_LOG_FILE = "/dev/stderr"
"""Where the client library's own C++ logger writes (appending)."""
_LEVELS = (
    (logging.DEBUG, pulsar.LoggerLevel.Debug),
    (logging.INFO, pulsar.LoggerLevel.Info),
    (logging.WARNING, pulsar.LoggerLevel.Warn),
)
_INVALID = (
    pulsar.InvalidConfiguration,
    pulsar.InvalidTopicName,
    pulsar.InvalidUrl,
    pulsar.InvalidMessage,
)
_DENIED = (pulsar.AuthenticationError, pulsar.AuthorizationError, pulsar.NotAllowedError)


def client_log_level(level: int) -> pulsar.LoggerLevel:
    """The client library's level for a Python logging level (pure)."""
    for python_level, pulsar_level in _LEVELS:
        if level <= python_level:
            return pulsar_level
    return pulsar.LoggerLevel.Error


def new_client(settings: PulsarSettings) -> pulsar.Client:
    """A client whose library logs to stderr at the level of :data:`LOG`.

    The library's own file logger is used, not a Python logger: with a Python
    logger the client's threads call into the interpreter while it shuts
    down, and the process aborts at exit ("terminate called without an
    active exception", exit code 134) in about one run of six.
    """
    kwargs: dict[str, Any] = settings.client_kwargs()
    if settings.auth_token is not None:
        kwargs["authentication"] = pulsar.AuthenticationToken(settings.auth_token)
    kwargs["logger"] = pulsar.FileLogger(client_log_level(LOG.getEffectiveLevel()), CLIENT_LOG_FILE)
    try:
        return pulsar.Client(settings.service_url, **kwargs)
    except (pulsar.PulsarException, ValueError, TypeError) as exc:
        raise errors.InvalidArgument(f"pulsar client options are invalid: {exc}") from None


def translate(exc: BaseException, what: str, settings: PulsarSettings) -> errors.HeadraceError:
    """The Headrace error for a client exception met while doing ``what``."""
    if isinstance(exc, errors.HeadraceError):
        return exc
    text = f"pulsar {what} ({settings.service_url}): {exc}"
    if isinstance(exc, pulsar.ProducerFenced):
        return errors.Fenced(text)
    if isinstance(exc, pulsar.MessageTooBig):
        return errors.MessageTooLarge(text)
    if isinstance(exc, _INVALID):
        return errors.InvalidArgument(text)
    if isinstance(exc, _DENIED):
        return errors.Unavailable(text, retryable=False)
    if isinstance(exc, pulsar.TopicTerminated):
        return errors.HeadraceError(text)
    if isinstance(exc, pulsar.Timeout | pulsar.ConnectError | pulsar.NotConnected):
        return errors.Unavailable(
            f"{text} (no answer within {settings.operation_timeout_s:g} s: "
            "is the broker running and reachable?)"
        )
    return errors.Unavailable(text)


def boundary(settings: PulsarSettings) -> Boundary:
    """Where the backend's client calls return: client exceptions are translated there."""

    def translate_here(exc: BaseException, what: str) -> errors.HeadraceError:
        return translate(exc, what, settings)

    return Boundary("pulsar", (pulsar.PulsarException,), translate_here)


def close_quietly(closable: Any, what: str) -> None:
    """Close a producer, reader or client (None: nothing) that may be gone already;
    a failure is only logged, as ``what``."""
    if closable is None:
        return
    try:
        closable.close()
    except pulsar.PulsarException as exc:
        LOG.debug("closing %s: %s", what, exc)


def to_pulsar(mid: PulsarMessageID) -> pulsar.MessageId:
    return pulsar.MessageId(mid.partition, mid.ledger, mid.entry, mid.batch)


def from_pulsar(mid: pulsar.MessageId) -> PulsarMessageID:
    return PulsarMessageID(mid.ledger_id(), mid.entry_id(), mid.partition(), mid.batch_index())


def stamp(msg: pulsar.Message) -> PulsarStamp:
    return stamp_of(msg.properties())


def _hold(client: pulsar.Client, topic: str, subscription: str) -> None:
    consumer = client.subscribe(
        topic,
        subscription,
        consumer_type=pulsar.ConsumerType.Shared,
        receiver_queue_size=0,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    consumer.close()


def ensure_topics(client: pulsar.Client, settings: PulsarSettings, pchannel: str) -> None:
    """Create the durable subscriptions that keep the data (and the topics with them)."""
    topic = settings.topic(pchannel)
    try:
        _hold(client, topic, SUBSCRIPTION)
        _hold(client, settings.marks_topic(pchannel), KEEP_SUBSCRIPTION)
    except pulsar.PulsarException as exc:
        raise translate(exc, f"preparing topic {topic}", settings) from None


def _reader(client: pulsar.Client, topic: str, start: pulsar.MessageId, inclusive: bool) -> Any:
    return client.create_reader(
        topic, start, start_message_id_inclusive=inclusive, receiver_queue_size=100
    )


def read_last(client: pulsar.Client, settings: PulsarSettings, topic: str) -> pulsar.Message | None:
    """The topic's last message of any kind, or None if it has none."""
    try:
        reader = _reader(client, topic, pulsar.MessageId.latest, True)
        try:
            if not reader.has_message_available():
                return None
            message: pulsar.Message = reader.read_next(_millis(settings))
            return message
        finally:
            reader.close()
    except pulsar.PulsarException as exc:
        raise translate(exc, f"reading the end of {topic}", settings) from None


def read_first_data(
    client: pulsar.Client, settings: PulsarSettings, topic: str, start: PulsarMessageID | None
) -> pulsar.Message | None:
    """The first data message at or after ``start`` (the earliest when None)."""
    position = pulsar.MessageId.earliest if start is None else to_pulsar(start)
    try:
        reader = _reader(client, topic, position, True)
        try:
            while reader.has_message_available():
                message: pulsar.Message = reader.read_next(_millis(settings))
                if stamp(message).kind is Kind.DATA:
                    return message
            return None
        finally:
            reader.close()
    except pulsar.PulsarException as exc:
        raise translate(exc, f"reading {topic}", settings) from None


def read_stamps(
    client: pulsar.Client,
    settings: PulsarSettings,
    topic: str,
    after: PulsarMessageID | None,
    until: PulsarMessageID,
) -> list[tuple[PulsarMessageID, PulsarStamp]]:
    """The stamps of the messages after ``after`` (from the earliest when None) and
    before ``until``, an acknowledged message: read from storage, so messages
    whose persistence was still under way at an earlier look at the end are seen."""
    position = pulsar.MessageId.earliest if after is None else to_pulsar(after)
    found: list[tuple[PulsarMessageID, PulsarStamp]] = []
    try:
        reader = _reader(client, topic, position, False)
        try:
            while True:
                message: pulsar.Message = reader.read_next(_millis(settings))
                mid = from_pulsar(message.message_id())
                if mid >= until:
                    return found
                found.append((mid, stamp(message)))
        finally:
            reader.close()
    except pulsar.PulsarException as exc:
        raise translate(exc, f"reading {topic} up to {until}", settings) from None


def read_own_last(
    client: pulsar.Client,
    settings: PulsarSettings,
    topic: str,
    *,
    after: PulsarMessageID | None,
    producer_name: str,
    count: int,
) -> list[pulsar.Message]:
    """The last ``count`` (at most) messages of ``producer_name`` stored after ``after``
    (from the earliest when None), in log order."""
    position = pulsar.MessageId.earliest if after is None else to_pulsar(after)
    own: collections.deque[pulsar.Message] = collections.deque(maxlen=count)
    try:
        reader = _reader(client, topic, position, False)
        try:
            while reader.has_message_available():
                message: pulsar.Message = reader.read_next(_millis(settings))
                if message.producer_name() == producer_name:
                    own.append(message)
        finally:
            reader.close()
    except pulsar.PulsarException as exc:
        raise translate(exc, f"reading back {topic}", settings) from None
    return list(own)


def read_exact(
    client: pulsar.Client, settings: PulsarSettings, topic: str, mid: PulsarMessageID
) -> pulsar.Message | None:
    message = read_first_data(client, settings, topic, mid)
    if message is None or from_pulsar(message.message_id()) != mid:
        return None
    return message


def read_mark(
    client: pulsar.Client, settings: PulsarSettings, pchannel: str
) -> PulsarMessageID | None:
    """The truncation point of ``pchannel``, None if it was never truncated."""
    message = read_last(client, settings, settings.marks_topic(pchannel))
    if message is None:
        return None
    return PulsarMessageID.from_bytes(message.data())


def truncate(
    client: pulsar.Client, settings: PulsarSettings, pchannel: str, before: PulsarMessageID
) -> None:
    """Record ``before`` as the truncation point, then let retention drop older ledgers.

    A point beyond the last message is clamped to just after it, so records
    appended later are never hidden.
    """
    topic = settings.topic(pchannel)
    last = read_last(client, settings, topic)
    if last is None:
        return
    before = min(before, next_position(from_pulsar(last.message_id())))
    current = read_mark(client, settings, pchannel)
    if current is not None and current >= before:
        return
    try:
        producer = client.create_producer(
            settings.marks_topic(pchannel), send_timeout_millis=settings.send_timeout_ms
        )
        try:
            producer.send(before.to_bytes())
        finally:
            producer.close()
        consumer = client.subscribe(
            topic, SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=0
        )
        try:
            consumer.seek(to_pulsar(before))
        finally:
            consumer.close()
    except pulsar.PulsarException as exc:
        raise translate(exc, f"truncating {topic}", settings) from None


def next_position(mid: PulsarMessageID) -> PulsarMessageID:
    """The position right after ``mid`` in its ledger (pure)."""
    return PulsarMessageID(mid.ledger, mid.entry + 1)


def _millis(settings: PulsarSettings) -> int:
    return int(settings.operation_timeout_s * 1000)
