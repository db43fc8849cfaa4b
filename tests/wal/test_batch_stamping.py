"""A producer's batch is stamped without a copy of its bytes on the append path
(:class:`~headrace.message.batch.Stamped`): what is stored, what tail readers
get and what the producer keeps are the same as with the stamped copy."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from headrace.message import batch
from headrace.message.batch import BatchInfo, Stamped
from headrace.message.records import BatchEntry
from headrace.message.types import Message, MessageType
from headrace.tso import LocalTSO
from headrace.wal import registry
from headrace.wal.api import BatchAppendResult, DeliverPolicy, ReadOptions
from headrace.wal.contract import Backend, StartPosition
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.local import segment
from headrace.wal.local.message_id import LocalMessageID

OPTIONS = WALOptions(timetick_interval_ms=3_600_000, message_format=2)
WAIT = 10.0


def producer_batch(tag: str, n: int = 4) -> bytes:
    msgs = [Message(MessageType.INSERT, "v", b"%s-%d" % (tag.encode(), i)) for i in range(n)]
    return batch.encode(msgs, BatchInfo("v"))


BROKERS = [
    pytest.param("kafka", marks=pytest.mark.kafka),
    pytest.param("pulsar", marks=pytest.mark.pulsar),
]


def backend_of(kind: str, tmp_path: Path) -> Backend:
    if kind == "local":
        return registry.create("local", root=str(tmp_path))
    prefix = f"stamping.{uuid.uuid4().hex[:12]}."
    if kind == "kafka":
        from tests.fixtures_brokers import kafka_bootstrap_address  # noqa: PLC0415

        return registry.create(
            "kafka", bootstrap_servers=kafka_bootstrap_address(), topic_prefix=prefix
        )
    if kind == "pulsar":
        from tests.fixtures_brokers import pulsar_service_url  # noqa: PLC0415

        return registry.create("pulsar", service_url=pulsar_service_url(), topic_prefix=prefix)
    return registry.create("memory")


async def stored_data(backend: Backend, record_id: object) -> bytes:
    reader = await backend.open_reader("p", StartPosition.earliest())
    try:
        while True:
            got = await reader.next_batch(64, timeout=WAIT)
            assert got, "the reader stalled before the batch"
            for record in got:
                if record.id == record_id:
                    return record.data
    finally:
        await reader.close()


async def append_and_tail(
    wal: WAL, data: bytes | bytearray
) -> tuple[BatchAppendResult, BatchEntry]:
    scanner = wal.read(ReadOptions(policy=DeliverPolicy.LATEST))
    await scanner.open()
    try:
        (result,) = await wal.append_batches([data])  # type: ignore[list-item]
        assert isinstance(result, BatchAppendResult), result
        async with asyncio.timeout(WAIT):
            while True:
                units = await scanner.next_units(16, timeout=WAIT)
                unit = next((u for u in units if isinstance(u, BatchEntry)), None)
                if unit is not None and not unit.header.system:
                    return result, unit
    finally:
        await scanner.close()


@pytest.mark.parametrize("kind", ["memory", "local", *BROKERS])
async def test_stored_and_tailed_batch_is_the_producers_bytes_stamped(
    kind: str, tmp_path: Path
) -> None:
    backend = backend_of(kind, tmp_path)
    wal = await WAL.open(backend, "p", 3, tso=LocalTSO(), options=OPTIONS)
    data = producer_batch("a")
    original = bytes(bytearray(data))
    result, unit = await append_and_tail(wal, data)
    await wal.close()
    expected = batch.stamped(original, result.timetick, 3)
    assert data == original, "the producer's bytes are left as they were"
    assert unit.data == expected, "a tail reader gets the stamped batch"
    assert batch.verify(unit.data) == unit.header
    assert [e.message.timetick for e in unit.entries()] == [result.timetick + i for i in range(4)]
    assert await stored_data(backend, result.record_id) == expected
    await backend.close()


@pytest.mark.parametrize("kind", ["local", *BROKERS])
async def test_the_buffer_keeps_the_producers_bytes_and_the_stamp_apart(
    kind: str, tmp_path: Path
) -> None:
    # A copy joined for the write and kept by the write-ahead buffer took fresh
    # memory, page-faulted in, for every batch (issue #14): the buffer keeps the
    # producer's bytes, a tail reader that needs them whole joins them.
    backend = backend_of(kind, tmp_path)
    wal = await WAL.open(backend, "p", 2, tso=LocalTSO(), options=OPTIONS)
    data = producer_batch("k")
    result, unit = await append_and_tail(wal, data)
    assert isinstance(unit.record, Stamped)
    assert unit.record.records is data, "the buffer holds the producer's bytes, not a copy"
    await wal.close()
    expected = batch.stamped(data, result.timetick, 2)
    assert unit.data == expected
    assert await stored_data(backend, result.record_id) == expected
    await backend.close()


@pytest.mark.parametrize("kind", ["memory", "local", *BROKERS])
async def test_a_mutable_buffer_changed_after_its_append_changes_nothing_stored(
    kind: str, tmp_path: Path
) -> None:
    backend = backend_of(kind, tmp_path)
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=OPTIONS)
    data = bytearray(producer_batch("m"))
    original = bytes(data)
    result, unit = await append_and_tail(wal, data)
    data[:] = bytes(len(data))  # the producer reuses its buffer
    await wal.close()
    expected = batch.stamped(original, result.timetick, 1)
    assert unit.data == expected
    assert await stored_data(backend, result.record_id) == expected
    await backend.close()


def test_a_stamped_batch_in_parts_is_the_stamped_copy() -> None:
    data = producer_batch("s")
    stamped = Stamped(data, batch.verify(data).with_stamp(77, 5))
    assert len(stamped) == len(data)
    assert stamped.records is data
    assert b"".join(stamped.parts()) == batch.stamped(data, 77, 5)
    header = batch.verify(b"".join(stamped.parts()))
    assert (header.base_timetick, header.term) == (77, 5)
    joined = stamped.joined()
    assert joined == batch.stamped(data, 77, 5)
    assert stamped.joined() is joined, "joined once, then kept"
    assert stamped.parts() == (joined,)
    assert stamped.records is joined


@pytest.mark.parametrize("version", segment.READABLE_VERSIONS)
def test_frames_of_a_stamped_batch_in_parts_are_those_of_its_copy(version: int) -> None:
    data = producer_batch("f")
    parts = [Stamped(data, batch.verify(data).with_stamp(9, 2)), b"plain record"]
    joined = [batch.stamped(data, 9, 2), b"plain record"]
    assert segment.encode_frames(40, parts, version) == segment.encode_frames(40, joined, version)
    assert parts[0].parts() != (joined[0],), "framing did not join the stamped batch"


def test_a_batch_entry_equals_its_stored_copy_and_decodes_without_joining() -> None:
    data = producer_batch("e")
    stamped = batch.stamped(data, 10, 1)
    header = batch.verify(stamped)
    rid = LocalMessageID(7)
    lazy = BatchEntry(rid, header, Stamped(data, header))
    assert [e.message.timetick for e in lazy.entries()] == [10, 11, 12, 13]
    assert isinstance(lazy.record, Stamped)
    assert lazy.record.records is data, "decoding did not join the stamp"
    assert lazy == BatchEntry(rid, header, stamped)
    assert lazy.data == stamped
