"""Pulsar: an append fenced in the middle ends at once, whatever its size.

The client queues at most a bounded number of a producer's sends. When
another writer takes the topic (an ``ExclusiveWithFencing`` producer) during
an append with more records than that, the append must fail with the fence at
once, not after the send timeout: here on the real broker, with a send
timeout of ten minutes, so an append that waits for it runs into the test's
own timeout. The records acknowledged before the fence are reported as
written and are stored once; nothing after them was sent twice.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pulsar
import pytest

from headrace import errors
from headrace.wal.brokers.contract import Lost
from headrace.wal.brokers.stamps import Kind, Stamp
from headrace.wal.pulsar import client
from headrace.wal.pulsar.settings import PulsarSettings, parse_settings
from headrace.wal.pulsar.writer import MAX_PENDING, SEND_WINDOW, PulsarLink, Turn, next_turn

_TEN_MINUTES_MS = 600_000


class _FencedAt:
    """The link's producer, with another link taking the topic just before send
    number ``at`` (1-based) goes out: the fence falls at a chosen point."""

    def __init__(self, real: Any, at: int, take: Callable[[], None]) -> None:
        self._real = real
        self._at = at
        self._take = take
        self.calls = 0

    def send_async(self, *args: Any, **kwargs: Any) -> None:
        self.calls += 1
        if self.calls == self._at:
            self._take()
        self._real.send_async(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.fixture
def settings(request: pytest.FixtureRequest) -> Iterator[PulsarSettings]:
    url = request.getfixturevalue("pulsar_url")
    found = parse_settings(
        {
            "service_url": url,
            "topic_prefix": f"test.{uuid.uuid4().hex[:12]}.",
            "send_timeout_ms": _TEN_MINUTES_MS,
        }
    )
    prepare = client.new_client(found)
    try:
        client.ensure_topics(prepare, found, "p0")
    finally:
        prepare.close()
    yield found


def _data(term: int) -> Stamp[Any]:
    return Stamp(Kind.DATA, term, 7)


def _stored(settings: PulsarSettings, producer: str) -> list[tuple[Any, bytes]]:
    """Ids and data of every message of ``producer`` on the topic, in log order."""
    reader_client = client.new_client(settings)
    try:
        found = client.read_own_last(
            reader_client,
            settings,
            settings.topic("p0"),
            after=None,
            producer_name=producer,
            count=1_000_000,
        )
        return [(client.from_pulsar(m.message_id()), m.data()) for m in found]
    finally:
        reader_client.close()


@dataclasses.dataclass(frozen=True)
class _Case:
    records: int
    fence_at: int


@pytest.mark.pulsar
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(_Case(records=5000, fence_at=3000), id="more-than-the-queue"),
        pytest.param(_Case(records=1500, fence_at=700), id="fewer-than-the-queue"),
        pytest.param(_Case(records=5000, fence_at=1), id="before-the-first-send"),
    ],
)
def test_fenced_append_ends_at_once_with_the_acknowledged_prefix(
    settings: PulsarSettings, case: _Case
) -> None:
    old = PulsarLink(settings, "p0", 1)
    new = PulsarLink(settings, "p0", 2)
    try:
        old.take()
        old._producer = _FencedAt(old._producer, case.fence_at, new.take)
        records = [f"r-{i}".encode() for i in range(case.records)]
        with pytest.raises(Lost) as lost:
            old.send(records, _data(1))
        written = lost.value.written
        assert len(written) < case.fence_at
        assert not old.held()
        stored = _stored(settings, old.producer_name)
        assert [data for _, data in stored] == records[: len(stored)], "each record once, in order"
        assert [mid for mid, _ in stored[: len(written)]] == written
        # The new owner writes on.
        assert len(new.send([b"after"], _data(2))) == 1
    finally:
        old.release()
        new.release()


class _FakeProducer:
    """A producer whose broker answers each send with ``answer`` (None: never),
    on a thread of its own as the client does; it records the most sends it
    had unanswered at once."""

    def __init__(self, answer: pulsar.Result | None) -> None:
        self._answer = answer
        self._lock = threading.Lock()
        self._unanswered: list[tuple[Callable[[Any, Any], None], int]] = []
        self.sent = 0
        self.most_unanswered = 0
        self._answering = threading.Thread(target=self._answer_all, daemon=True)
        self._stop = threading.Event()
        self._answering.start()

    def send_async(self, _data: bytes, callback: Any, **_options: Any) -> None:
        with self._lock:
            self.sent += 1
            self._unanswered.append((callback, self.sent))
            self.most_unanswered = max(self.most_unanswered, len(self._unanswered))

    def _answer_all(self) -> None:
        while not self._stop.wait(0.001):
            if self._answer is None:
                continue
            with self._lock:
                due, self._unanswered = self._unanswered, []
            for callback, entry in due:
                callback(self._answer, pulsar.MessageId(-1, 5, entry, -1))

    def close(self) -> None:
        self._stop.set()


def _link_with(producer: _FakeProducer) -> PulsarLink:
    settings = parse_settings(
        {"service_url": "pulsar://127.0.0.1:1", "send_timeout_ms": 50, "operation_timeout_s": 0.1}
    )
    link = PulsarLink(settings, "p0", 1)
    link._producer = producer
    return link


def test_a_link_keeps_at_most_its_window_unanswered_and_pipelines_the_rest() -> None:
    producer = _FakeProducer(pulsar.Result.Ok)
    link = _link_with(producer)
    try:
        ids = link.send([b"r"] * (3 * SEND_WINDOW + 5), _data(1))
    finally:
        link.release()
    assert [mid.entry for mid in ids] == list(range(1, 3 * SEND_WINDOW + 6))
    assert producer.most_unanswered <= SEND_WINDOW < MAX_PENDING


def test_a_broker_that_answers_nothing_fails_the_append_without_filling_the_queue() -> None:
    producer = _FakeProducer(None)
    link = _link_with(producer)
    try:
        with pytest.raises(errors.Unavailable, match="not answered in time"):
            link.send([b"r"] * (3 * SEND_WINDOW), _data(1))
        assert not link.held()
    finally:
        link.release()
    assert producer.sent == SEND_WINDOW, "the rest waited for room, and was not sent"


def test_a_broker_that_refuses_gets_nothing_more_after_the_first_failure() -> None:
    producer = _FakeProducer(pulsar.Result.Timeout)
    link = _link_with(producer)
    try:
        with pytest.raises(errors.Unavailable, match="failed with"):
            link.send([b"r"] * (3 * SEND_WINDOW), _data(1))
    finally:
        link.release()
    assert producer.sent <= SEND_WINDOW


def test_next_turn_waits_only_for_room_and_stops_at_a_failure() -> None:
    assert next_turn(0, failed=False) is Turn.SEND
    assert next_turn(SEND_WINDOW - 1, failed=False) is Turn.SEND
    assert next_turn(SEND_WINDOW, failed=False) is Turn.WAIT
    assert next_turn(0, failed=True) is Turn.STOP
    assert next_turn(SEND_WINDOW, failed=True) is Turn.STOP
