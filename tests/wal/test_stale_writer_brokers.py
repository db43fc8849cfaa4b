"""A stale writer cannot write past a newer term: Kafka and Pulsar, real brokers.

The brokers fence (Kafka: producer epoch of the transactional id; Pulsar:
ExclusiveWithFencing producers); the backends add the term rule on top.
``kafka-chained`` runs the same tests on Kafka's writer of message format 2
logs, which fences by where its records land (no transactions). Each test
uses its own topic prefix, so tests share one broker per session.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from headrace import errors
from headrace.wal import registry
from headrace.wal.contract import Backend, BackendWriter, Record, StartPosition
from tests.wal.delegating import FormatBackend

pytestmark = pytest.mark.timeout(120)


def _kafka_interloper(backend: Backend, pchannel: str) -> None:
    """Take the transactional id's epoch like a stale opener that then gives up."""
    from confluent_kafka import Producer  # noqa: PLC0415

    from headrace.wal.kafka.backend import KafkaBackend  # noqa: PLC0415

    assert isinstance(backend, KafkaBackend)
    topic = backend.settings.topic(pchannel)
    producer = Producer(backend.settings.producer_config(topic))
    producer.init_transactions(30.0)


def _kafka_chained_interloper(backend: Backend, pchannel: str) -> None:
    """Land a record between the chained writer's, like a stale opener's fence record."""
    from confluent_kafka import Producer  # noqa: PLC0415

    from headrace.wal.brokers.stamps import Kind, Stamp  # noqa: PLC0415
    from headrace.wal.kafka.fencing import header  # noqa: PLC0415

    inner = backend.inner if isinstance(backend, FormatBackend) else backend
    settings = inner.settings  # type: ignore[attr-defined]
    producer = Producer(settings.idempotent_producer_config())
    producer.produce(
        settings.topic(pchannel), b"", partition=0, headers=header(Stamp(Kind.FENCE, 0, 1))
    )
    assert producer.flush(30.0) == 0


def _pulsar_interloper(backend: Backend, pchannel: str) -> None:
    """Fence the writer's producer with a raw ExclusiveWithFencing producer."""
    import pulsar  # noqa: PLC0415

    from headrace.wal.pulsar.backend import PulsarBackend  # noqa: PLC0415

    assert isinstance(backend, PulsarBackend)
    client = pulsar.Client(backend.settings.service_url)
    try:
        producer = client.create_producer(
            backend.settings.topic(pchannel),
            access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing,
        )
        producer.close()
    finally:
        client.close()


@pytest.fixture(
    params=[
        pytest.param("kafka", marks=pytest.mark.kafka),
        pytest.param("kafka-chained", marks=pytest.mark.kafka),
        pytest.param("pulsar", marks=pytest.mark.pulsar),
    ]
)
async def broker_backend(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[Backend, Callable[[Backend, str], None]]]:
    prefix = f"test.{uuid.uuid4().hex[:12]}."
    if request.param == "kafka":
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        backend = registry.create(
            "kafka", bootstrap_servers=bootstrap, topic_prefix=prefix, operation_timeout_s=30.0
        )
        interloper = _kafka_interloper
    elif request.param == "kafka-chained":
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        inner = registry.create(
            "kafka", bootstrap_servers=bootstrap, topic_prefix=prefix, operation_timeout_s=30.0
        )
        backend = FormatBackend(inner, 2)
        interloper = _kafka_chained_interloper
    else:
        url = request.getfixturevalue("pulsar_url")
        backend = registry.create("pulsar", service_url=url, topic_prefix=prefix)
        interloper = _pulsar_interloper
    try:
        yield backend, interloper
    finally:
        await backend.close()


async def _read_all(backend: Backend, pchannel: str) -> list[Record]:
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
    return records


async def test_stale_writer_is_fenced_and_invisible(
    broker_backend: tuple[Backend, Callable[[Backend, str], None]],
) -> None:
    backend, _ = broker_backend
    old = await backend.open_writer("p0", 1)
    old_ids = await old.append([b"old-1", b"old-2"])
    new = await backend.open_writer("p0", 2)
    first_new = await new.append([b"new-1"])
    with pytest.raises(errors.Fenced) as fenced:
        await old.append([b"stale"])
    assert fenced.value.retryable
    with pytest.raises(errors.Fenced):
        await old.append([b"stale-again"])
    await new.append([b"new-2"])

    records = await _read_all(backend, "p0")
    assert [r.data for r in records] == [b"old-1", b"old-2", b"new-1", b"new-2"]
    assert [r.id for r in records[:2]] == old_ids
    assert records[2].id == first_new[0]
    assert [r.id for r in records] == sorted(r.id for r in records)
    await old.close()
    await new.close()


async def test_lower_term_cannot_open_and_does_not_disturb_the_owner(
    broker_backend: tuple[Backend, Callable[[Backend, str], None]],
) -> None:
    backend, _ = broker_backend
    owner = await backend.open_writer("p1", 5)
    await owner.append([b"a"])
    with pytest.raises(errors.Fenced) as fenced:
        await backend.open_writer("p1", 4)
    assert fenced.value.current_term == 5
    assert [r.data for r in await _read_all(backend, "p1")] == [b"a"]
    await owner.append([b"b"])
    assert [r.data for r in await _read_all(backend, "p1")] == [b"a", b"b"]
    await owner.close()


async def test_fence_record_hides_behind_last_record(
    broker_backend: tuple[Backend, Callable[[Backend, str], None]],
) -> None:
    backend, _ = broker_backend
    assert await backend.last_record("p2") is None
    first = await backend.open_writer("p2", 1)
    assert await backend.last_record("p2") is None
    ids = await first.append([b"x", b"y"])
    await first.close()
    second = await backend.open_writer("p2", 2)
    last = await backend.last_record("p2")
    assert last == Record(ids[-1], b"y")
    assert await backend.earliest("p2") == ids[0]
    await second.close()


async def test_owner_takes_its_topic_back_from_a_stale_interloper(
    broker_backend: tuple[Backend, Callable[[Backend, str], None]],
) -> None:
    backend, interloper = broker_backend
    owner: BackendWriter = await backend.open_writer("p3", 7)
    await owner.append([b"before"])
    await asyncio.to_thread(interloper, backend, "p3")
    await owner.append([b"after"])
    assert [r.data for r in await _read_all(backend, "p3")] == [b"before", b"after"]
    await owner.close()


async def test_same_term_reopen_fences_the_previous_writer(
    broker_backend: tuple[Backend, Callable[[Backend, str], None]],
) -> None:
    backend, _ = broker_backend
    first = await backend.open_writer("p4", 3)
    await first.append([b"one"])
    second = await backend.open_writer("p4", 3)
    await second.append([b"two"])
    with pytest.raises(errors.Fenced):
        await first.append([b"lost"])
    assert [r.data for r in await _read_all(backend, "p4")] == [b"one", b"two"]
    await first.close()
    await second.close()
