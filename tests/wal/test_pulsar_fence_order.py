"""Pulsar: the order of fencing in the broker follows term order.

An opener looks at the topic's end, takes the topic with an
``ExclusiveWithFencing`` producer and writes its fence record. A record of a
higher term whose persistence was still under way at that look (a send in
flight, or queued by the client across a broker restart) is stored before
the fence without being seen. The chaos run with broker restarts met this: a
lower term's fence landed after a higher term's. Here the look at the end is
made to lag exactly that way, on the real broker, so the race is
deterministic.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from headrace import errors
from headrace.wal import registry
from headrace.wal.brokers.stamps import Kind, Stamp, overtaken
from headrace.wal.contract import Record, StartPosition
from headrace.wal.pulsar import client
from headrace.wal.pulsar.backend import PulsarBackend
from headrace.wal.pulsar.message_id import PulsarMessageID

_ReadLast = Callable[[Any, Any, str], Any]


@pytest.fixture
async def pulsar_backend(request: pytest.FixtureRequest) -> AsyncIterator[PulsarBackend]:
    url = request.getfixturevalue("pulsar_url")
    backend = registry.create(
        "pulsar", service_url=url, topic_prefix=f"test.{uuid.uuid4().hex[:12]}."
    )
    assert isinstance(backend, PulsarBackend)
    try:
        yield backend
    finally:
        await backend.close()


def _lagging(real: _ReadLast, topic: str, stale_end: Any) -> _ReadLast:
    """``read_last`` that shows ``topic``'s end as it was before the newer records."""

    def read_last(pulsar_client: Any, settings: Any, name: str) -> Any:
        return stale_end if name == topic else real(pulsar_client, settings, name)

    return read_last


async def _datas(backend: PulsarBackend, pchannel: str) -> list[bytes]:
    last = await backend.last_record(pchannel)
    assert last is not None
    reader = await backend.open_reader(pchannel, StartPosition.earliest())
    records: list[Record] = []
    try:
        while not records or records[-1].id < last.id:
            batch = await reader.next_batch(100, timeout=20.0)
            assert batch, f"reader stalled after {records}"
            records += batch
    finally:
        await reader.close()
    return [r.data for r in records]


def _end_stamp(backend: PulsarBackend, pchannel: str) -> Stamp[PulsarMessageID]:
    topic = backend.settings.topic(pchannel)
    last = client.read_last(backend._client, backend.settings, topic)
    assert last is not None
    return client.stamp(last)


@pytest.mark.pulsar
@pytest.mark.timeout(120)
async def test_lower_term_opener_that_missed_a_higher_fence_is_fenced(
    pulsar_backend: PulsarBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = pulsar_backend
    topic = backend.settings.topic("p0")
    first = await backend.open_writer("p0", 1)
    await first.append([b"a-1"])
    await first.close()
    stale_end = client.read_last(backend._client, backend.settings, topic)

    owner = await backend.open_writer("p0", 2)
    await owner.append([b"b-1"])

    # Term 1 opens while its looks at the end still miss term 2's records.
    monkeypatch.setattr(client, "read_last", _lagging(client.read_last, topic, stale_end))
    with pytest.raises(errors.Fenced) as fenced:
        await backend.open_writer("p0", 1)
    assert fenced.value.current_term == 2
    monkeypatch.undo()

    # The end carries term 2 again: later lower-term openers are fenced at once.
    assert _end_stamp(backend, "p0").term == 2
    with pytest.raises(errors.Fenced):
        await backend.open_writer("p0", 1)

    # The owner takes its topic back and nothing of term 1 follows term 2.
    await owner.append([b"b-2"])
    assert await _datas(backend, "p0") == [b"a-1", b"b-1", b"b-2"]
    await owner.close()


@pytest.mark.pulsar
@pytest.mark.timeout(120)
async def test_higher_term_opener_that_missed_records_still_takes_the_topic(
    pulsar_backend: PulsarBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = pulsar_backend
    topic = backend.settings.topic("p1")
    first = await backend.open_writer("p1", 1)
    stale_end = client.read_last(backend._client, backend.settings, topic)
    await first.append([b"a-1"])

    monkeypatch.setattr(client, "read_last", _lagging(client.read_last, topic, stale_end))
    newer = await backend.open_writer("p1", 2)
    monkeypatch.undo()
    with pytest.raises(errors.Fenced):
        await first.append([b"stale"])
    await newer.append([b"b-1"])
    assert await _datas(backend, "p1") == [b"a-1", b"b-1"]
    await first.close()
    await newer.close()


def _id(entry: int) -> PulsarMessageID:
    return PulsarMessageID(7, entry)


def test_overtaken_names_the_highest_term_and_the_last_data_message() -> None:
    before = [
        (_id(3), Stamp(Kind.FENCE, 5, 50, _id(2))),
        (_id(4), Stamp(Kind.DATA, 5, 50)),
        (_id(5), Stamp(Kind.FENCE, 6, 60, _id(4))),
    ]
    found = overtaken("p", 4, 40, before, _id(2), reacquire=False)
    assert found is not None
    assert found.fenced.current_term == 6
    assert found.restore == Stamp(Kind.FENCE, 6, 60, _id(4))


def test_overtaken_lets_lower_terms_and_its_own_records_pass() -> None:
    before = [(_id(3), Stamp(Kind.DATA, 3, 30)), (_id(4), Stamp(Kind.FENCE, 4, 40, _id(3)))]
    assert overtaken("p", 4, 40, before, None, reacquire=True) is None
    assert overtaken("p", 4, 41, before, None, reacquire=False) is None


def test_overtaken_on_reacquire_yields_to_another_writer_of_its_term() -> None:
    before = [(_id(3), Stamp(Kind.FENCE, 4, 99, None))]
    found = overtaken("p", 4, 40, before, None, reacquire=True)
    assert found is not None
    assert found.restore == Stamp(Kind.FENCE, 4, 99, None)
