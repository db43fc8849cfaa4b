"""Pulsar: each acknowledged record is stored once, also when the client resends.

When the connection to the broker is lost while sends are on the wire (a
stalled broker, a topic unloaded), the client resends the unacknowledged
messages, some of which the broker had stored; without deduplication it
stores them again. Unloading the topic while an append's records are in
flight makes the broker close the producer with receipts still owed, so the
client resends: here on the real broker, several times per test.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from headrace import errors
from headrace.message.ids import MessageID
from headrace.wal import registry
from headrace.wal.contract import Backend, Record, StartPosition
from headrace.wal.pulsar.settings import parse_settings
from headrace.wal.pulsar.writer import (
    FIRST_SEQUENCE_ID,
    next_sequence_id,
    producer_name,
    stored_count,
)

pytestmark = pytest.mark.timeout(240)

_RECORDS_PER_APPEND = 1500
_ROUNDS = 4


def test_sequence_ids_continue_above_everything_used() -> None:
    assert next_sequence_id(FIRST_SEQUENCE_ID, -1) == FIRST_SEQUENCE_ID == 1
    # A new producer of the same name continues after the broker's last id ...
    assert next_sequence_id(1, 41) == 42
    # ... and never reuses an id the link already gave (maybe stored, maybe not).
    assert next_sequence_id(60, 41) == 60
    assert next_sequence_id(0, -1) == 1, "0 means 'none given' to the client"


def test_how_many_records_of_a_lost_send_the_broker_stored() -> None:
    # Records sent under 10, 11, 12; the broker's last id for the name says.
    assert stored_count(10, 3, -1) == 0
    assert stored_count(10, 3, 9) == 0
    assert stored_count(10, 3, 11) == 2
    assert stored_count(10, 3, 40) == 3, "later ids are the new producer's, not these"


def test_each_writer_has_a_producer_name_of_its_own() -> None:
    first, second = producer_name("p-1", 7), producer_name("p-1", 7)
    assert first != second
    assert first.startswith("headrace.p-1.t7.") and second.startswith("headrace.p-1.t7.")


def test_deduplication_setting() -> None:
    url = "pulsar://127.0.0.1:1"
    assert parse_settings({"service_url": url}).deduplication == "require"
    assert parse_settings({"service_url": url, "deduplication": "warn"}).deduplication == "warn"
    assert parse_settings({"service_url": url}).describe()["deduplication"] == "require"
    with pytest.raises(errors.InvalidArgument, match="deduplication must be one of"):
        parse_settings({"service_url": url, "deduplication": "off"})


def _admin(admin_url: str, method: str, path: str, body: Any = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{admin_url}/admin/v2/{path}",
        data=data,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60.0) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.fixture
async def backend(pulsar_url: str) -> AsyncIterator[Backend]:
    created = registry.create(
        "pulsar", service_url=pulsar_url, topic_prefix=f"dedup.{uuid.uuid4().hex[:12]}."
    )
    try:
        yield created
    finally:
        await created.close()


async def _read_all(backend: Backend, pchannel: str, last: MessageID) -> list[Record]:
    reader = await backend.open_reader(pchannel, StartPosition.earliest())
    records: list[Record] = []
    try:
        while not records or records[-1].id < last:
            batch = await reader.next_batch(5000, timeout=30.0)
            assert batch, f"read {len(records)} records, the last acknowledged is {last}"
            records += batch
    finally:
        await reader.close()
    return records


@pytest.mark.pulsar
async def test_records_resent_after_a_topic_unload_are_stored_once(
    backend: Backend, pulsar_admin_url: str
) -> None:
    pchannel = "p0"
    writer = await backend.open_writer(pchannel, 1)
    topic = backend.describe()["topic_prefix"] + pchannel
    unload = f"persistent/public/default/{topic}/unload"
    sent: list[bytes] = []
    acked: list[MessageID] = []
    try:
        for round_ in range(_ROUNDS):
            records = [b"r%d-%06d" % (round_, i) for i in range(_RECORDS_PER_APPEND)]
            append = asyncio.ensure_future(writer.append(records))
            await asyncio.sleep(0.05 * (round_ + 1))
            assert await asyncio.to_thread(_admin, pulsar_admin_url, "PUT", unload) == 204
            acked += await append
            sent += records
    finally:
        await writer.close()
    stored = await _read_all(backend, pchannel, acked[-1])
    copies = len(stored) - len({r.data for r in stored})
    assert copies == 0, f"{copies} of {len(stored)} stored records are copies"
    assert [r.data for r in stored] == sent
    assert [r.id for r in stored] == acked, "the ids acknowledged are not those stored"


@pytest.fixture
def namespace_without_deduplication(pulsar_admin_url: str) -> str:
    namespace = f"nodedup-{uuid.uuid4().hex[:10]}"
    assert _admin(pulsar_admin_url, "PUT", f"namespaces/public/{namespace}", {}) == 204
    policy = f"namespaces/public/{namespace}/deduplication"
    assert _admin(pulsar_admin_url, "POST", policy, False) == 204
    return namespace


@pytest.mark.pulsar
async def test_a_broker_that_does_not_deduplicate_is_refused(
    pulsar_url: str, namespace_without_deduplication: str
) -> None:
    backend = registry.create(
        "pulsar", service_url=pulsar_url, namespace=namespace_without_deduplication
    )
    try:
        with pytest.raises(errors.Unavailable, match="does not deduplicate") as raised:
            await backend.open_writer("p0", 1)
        assert not raised.value.retryable
        assert "brokerDeduplicationEnabled" in str(raised.value)
    finally:
        await backend.close()


@pytest.mark.pulsar
async def test_deduplication_warn_writes_on_a_broker_without_it(
    pulsar_url: str, namespace_without_deduplication: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = registry.create(
        "pulsar",
        service_url=pulsar_url,
        namespace=namespace_without_deduplication,
        deduplication="warn",
    )
    try:
        with caplog.at_level(logging.WARNING, logger="headrace.wal.pulsar"):
            writer = await backend.open_writer("p0", 1)
        assert any("does not deduplicate" in r.getMessage() for r in caplog.records)
        try:
            [mid] = await writer.append([b"written"])
        finally:
            await writer.close()
        assert [r.data for r in await _read_all(backend, "p0", mid)] == [b"written"]
    finally:
        await backend.close()


def _link(pulsar_url: str) -> Any:
    from headrace.wal.pulsar import client  # noqa: PLC0415
    from headrace.wal.pulsar.writer import PulsarLink  # noqa: PLC0415

    settings = parse_settings(
        {"service_url": pulsar_url, "topic_prefix": f"dedup.{uuid.uuid4().hex[:12]}."}
    )
    shared = client.new_client(settings)
    try:
        client.ensure_topics(shared, settings, "p0")
    finally:
        shared.close()
    return PulsarLink(settings, "p0", 1)


def _resend_from(link: Any, sequence_id: int, last_acknowledged: MessageID) -> None:
    """Make the link's next send reuse sequence ids from ``sequence_id`` on, as the
    client does when it resends on a new connection messages whose receipts were
    lost: the last receipt the link got is ``last_acknowledged``'s."""
    link._next_seq = sequence_id
    link._floor = last_acknowledged


@pytest.mark.pulsar
async def test_a_resent_record_gets_the_id_of_its_stored_copy(pulsar_url: str) -> None:
    from headrace.wal.brokers.stamps import Kind, Stamp  # noqa: PLC0415

    def run() -> None:
        link = _link(pulsar_url)
        try:
            link.take()
            data = Stamp(Kind.DATA, 1, 5)
            [fence] = link.send([b""], Stamp(Kind.FENCE, 1, 5))
            first = link.send([b"a", b"b", b"c"], data)
            _resend_from(link, FIRST_SEQUENCE_ID + 2, first[0])  # after fence and check: b, c
            assert link.send([b"b", b"c"], data) == first[1:]
            # A new producer of the same name continues after the broker's last id.
            link.take()
            [later] = link.send([b"d"], data)
            assert later > first[-1]
            stored = link.stored(fence, later)
            assert [mid for mid, _ in stored] == first, f"stored twice: {stored}"
        finally:
            link.release()

    await asyncio.to_thread(run)


@pytest.mark.pulsar
async def test_a_dropped_copy_of_other_bytes_is_not_acknowledged(pulsar_url: str) -> None:
    from headrace.wal.brokers.stamps import Kind, Stamp  # noqa: PLC0415

    def run() -> None:
        link = _link(pulsar_url)
        try:
            link.take()
            data = Stamp(Kind.DATA, 1, 5)
            [fence] = link.send([b""], Stamp(Kind.FENCE, 1, 5))
            link.send([b"a", b"b"], data)
            _resend_from(link, FIRST_SEQUENCE_ID + 1, fence)
            # The broker drops these under ids it stored other bytes with: they are
            # not written, so they must not be acknowledged.
            with pytest.raises(errors.Unavailable, match="copies of stored"):
                link.send([b"x", b"y"], data)
        finally:
            link.release()

    await asyncio.to_thread(run)


def _take_producer(backend: Backend, pchannel: str) -> None:
    """Fence the writer's producer like a stale opener that then gives up."""
    import pulsar  # noqa: PLC0415

    from headrace.wal.pulsar.backend import PulsarBackend  # noqa: PLC0415

    assert isinstance(backend, PulsarBackend)
    interloper = pulsar.Client(backend.settings.service_url)
    try:
        producer = interloper.create_producer(
            backend.settings.topic(pchannel),
            access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing,
        )
        producer.close()
    finally:
        interloper.close()


@pytest.mark.pulsar
async def test_records_stored_when_the_producer_was_taken_midway_are_stored_once(
    backend: Backend,
) -> None:
    pchannel = "p0"
    writer = await backend.open_writer(pchannel, 1)
    sent: list[bytes] = []
    acked: list[MessageID] = []
    try:
        for round_ in range(_ROUNDS):
            records = [b"r%d-%06d" % (round_, i) for i in range(_RECORDS_PER_APPEND)]
            append = asyncio.ensure_future(writer.append(records))
            await asyncio.sleep(0.05 * (round_ + 1))
            await asyncio.to_thread(_take_producer, backend, pchannel)
            acked += await append
            sent += records
    finally:
        await writer.close()
    stored = await _read_all(backend, pchannel, acked[-1])
    copies = len(stored) - len({r.data for r in stored})
    assert copies == 0, f"{copies} of {len(stored)} stored records are copies"
    assert [r.data for r in stored] == sent
    assert [r.id for r in stored] == acked, "the ids acknowledged are not those stored"


def test_the_node_command_takes_the_deduplication_setting() -> None:
    from headrace.bench.procs import backend_args  # noqa: PLC0415
    from headrace.cli.main import build_parser  # noqa: PLC0415
    from headrace.cli.walflags import broker_settings  # noqa: PLC0415

    settings = {"service_url": "pulsar://b:6650", "deduplication": "warn"}
    flags = backend_args("pulsar", settings)
    assert flags[2:4] == ["--pulsar-deduplication", "warn"], flags
    node = ["node", "--node-id", "n1", "--metastore", "sqlite:///tmp/m.db"]
    assert broker_settings(build_parser().parse_args([*node, *flags]))["deduplication"] == "warn"
    plain = build_parser().parse_args([*node, "--wal", "pulsar", "--pulsar-url", "pulsar://b:1"])
    assert "deduplication" not in broker_settings(plain)
    with pytest.raises(SystemExit):
        build_parser().parse_args([*node, *flags[:3], "off"])
