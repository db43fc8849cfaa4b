"""The Kafka reader and scans hand over the records that came without waiting out their poll.

``Consumer.consume(n, timeout)`` returns only when it holds ``n`` messages or
``timeout`` passed. :class:`SimulatedConsumer` has those semantics on a
simulated clock (no real waiting, no timing assert): every wait it is asked to
sit out is added to ``waited``. A read with records already there must wait for
nothing; a read at a quiet tail may wait its whole poll.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from headrace.wal.brokers.stamps import Kind, Stamp
from headrace.wal.contract import Record, StartPosition
from headrace.wal.kafka import client, reader
from headrace.wal.kafka.backend import start_offset
from headrace.wal.kafka.fencing import HEADER_NAME, encode
from headrace.wal.kafka.message_id import KafkaMessageID
from headrace.wal.kafka.settings import KafkaSettings

SETTINGS = KafkaSettings(bootstrap_servers="127.0.0.1:1", operation_timeout_s=5.0)
DATA = encode(Stamp(Kind.DATA, 1, 7))
FENCE = encode(Stamp(Kind.FENCE, 1, 7, KafkaMessageID(0)))


class FakeError:
    def __init__(self, code: int) -> None:
        self._code = code

    def code(self) -> int:
        return self._code


class FakeMessage:
    def __init__(self, offset: int, header: bytes | None, value: bytes, eof: bool = False) -> None:
        self._offset = offset
        self._header = header
        self._value = value
        self._eof = eof

    def error(self) -> FakeError | None:
        return FakeError(client.KafkaError._PARTITION_EOF) if self._eof else None

    def offset(self) -> int:
        return self._offset

    def headers(self) -> list[tuple[str, bytes]]:
        return [] if self._header is None else [(HEADER_NAME, self._header)]

    def value(self) -> bytes:
        return self._value


class SimulatedConsumer:
    """librdkafka's ``consume(n, timeout)`` on a simulated clock.

    Also its rule for logical start offsets (the beginning, the end): assigned
    before the client knows the partition's leader, the offset query is retried
    after 500 ms, so the first record waits that long. And the end of the
    partition is reported after an empty fetch, which the broker holds for the
    consumer's ``fetch.wait.max.ms``.
    """

    ready: list[FakeMessage] = []
    waited = 0.0

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self._knows_leader = False
        self._query_retry_s = 0.0

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> object:
        self._knows_leader = True
        return object()

    def assign(self, partitions: list[Any]) -> None:
        logical = any(tp.offset < 0 for tp in partitions)
        self._query_retry_s = 0.5 if logical and not self._knows_leader else 0.0

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        cls = SimulatedConsumer
        if self._query_retry_s:
            cls.waited += self._query_retry_s
            self._query_retry_s = 0.0
        if len(cls.ready) < num_messages:
            cls.waited += timeout  # fewer than asked for: it sits out the timeout
        taken, cls.ready = cls.ready[:num_messages], cls.ready[num_messages:]
        if any(m.error() is not None for m in taken):
            cls.waited += int(self.config["fetch.wait.max.ms"]) / 1000
        return taken

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        return 0, 3

    def close(self) -> None:
        pass


@pytest.fixture
def consumer(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[SimulatedConsumer]]:
    monkeypatch.setattr(reader, "Consumer", SimulatedConsumer)
    monkeypatch.setattr(client, "Consumer", SimulatedConsumer)
    SimulatedConsumer.ready = []
    SimulatedConsumer.waited = 0.0
    yield SimulatedConsumer


def _source(offset: int | None = 0) -> reader.KafkaSource:
    source = reader.KafkaSource(SETTINGS, "t", offset)
    source.open()
    return source


def test_fetch_hands_over_what_came_without_waiting(consumer: type[SimulatedConsumer]) -> None:
    consumer.ready = [
        FakeMessage(0, FENCE, b""),
        FakeMessage(1, DATA, b"a"),
        FakeMessage(2, DATA, b"b"),
    ]
    source = _source()
    records = source.fetch(1024, 0.2)
    assert records == [Record(KafkaMessageID(1), b"a"), Record(KafkaMessageID(2), b"b")]
    assert consumer.waited == 0.0


def test_fetch_keeps_to_max_records(consumer: type[SimulatedConsumer]) -> None:
    consumer.ready = [FakeMessage(i, DATA, bytes([i])) for i in range(5)]
    source = _source()
    assert [r.id for r in source.fetch(2, 0.2)] == [KafkaMessageID(0), KafkaMessageID(1)]
    assert [r.id for r in source.fetch(1, 0.2)] == [KafkaMessageID(2)]
    assert [r.id for r in source.fetch(10, 0.2)] == [KafkaMessageID(3), KafkaMessageID(4)]
    assert consumer.waited == 0.0


def test_fetch_at_a_quiet_tail_waits_its_poll(consumer: type[SimulatedConsumer]) -> None:
    source = _source()
    assert source.fetch(1024, 0.2) == []
    assert consumer.waited == pytest.approx(0.2)


def test_a_scan_ends_at_eof_without_waiting(consumer: type[SimulatedConsumer]) -> None:
    consumer.ready = [
        FakeMessage(1, DATA, b"a"),
        FakeMessage(2, FENCE, b""),
        FakeMessage(3, None, b"", eof=True),
    ]
    tail = client.read_tail(SETTINGS, "t")
    assert tail is not None
    assert tail.last.offset == 2
    # The data record that counts before the fence record, not its older pointer (0).
    assert tail.last_data == KafkaMessageID(1)
    assert consumer.waited <= 0.01  # the empty fetch that tells the end, held briefly


def test_a_scan_keeps_the_fetch_wait_a_client_setting_gives(
    consumer: type[SimulatedConsumer],
) -> None:
    consumer.ready = [FakeMessage(1, DATA, b"a"), FakeMessage(2, None, b"", eof=True)]
    settings = KafkaSettings(bootstrap_servers="127.0.0.1:1", client={"fetch.wait.max.ms": "50"})
    assert client.read_tail(settings, "t") is not None
    assert consumer.waited == pytest.approx(0.05)


def test_a_reader_from_the_beginning_waits_for_no_offset_retry(
    consumer: type[SimulatedConsumer],
) -> None:
    consumer.ready = [FakeMessage(4, DATA, b"a")]
    source = _source(start_offset(StartPosition.earliest()))
    assert source.fetch(1024, 0.2) == [Record(KafkaMessageID(4), b"a")]
    assert consumer.waited == 0.0


@pytest.mark.parametrize("start", [StartPosition.latest(), StartPosition.at(KafkaMessageID(2))])
def test_readers_from_an_offset_wait_for_nothing(
    consumer: type[SimulatedConsumer], start: StartPosition
) -> None:
    source = _source(start_offset(start))
    consumer.ready = [FakeMessage(3, DATA, b"a")]
    assert source.fetch(1024, 0.2) == [Record(KafkaMessageID(3), b"a")]
    assert consumer.waited == 0.0
