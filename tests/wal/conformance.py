"""The one conformance suite of the WAL backend contract.

Every backend passes it unchanged: ``test_conformance.py`` runs
:class:`BackendConformance` with the ``backend_factory`` fixture of
``conftest.py`` (a :class:`BackendCase` per backend).
"""

from __future__ import annotations

import asyncio
import itertools
import random

import pytest

from headrace import errors
from headrace.message.ids import MessageID
from headrace.wal.contract import Backend, BackendReader, Record, StartPosition

from .conftest import BackendCase

WAIT = 10.0
"""Hang guard for waits that must succeed (never a timing assertion)."""


async def read_n(reader: BackendReader, count: int) -> list[Record]:
    out: list[Record] = []
    async with asyncio.timeout(WAIT):
        while len(out) < count:
            out += await reader.next_batch(max_records=count - len(out))
    return out


async def read_all(backend: Backend, pchannel: str, count: int) -> list[Record]:
    reader = await backend.open_reader(pchannel, StartPosition.earliest())
    try:
        records = await read_n(reader, count)
        assert await reader.next_batch(timeout=0.05) == []
    finally:
        await reader.close()
    return records


async def first_record(backend: Backend, pchannel: str, start: StartPosition) -> Record:
    reader = await backend.open_reader(pchannel, start)
    try:
        return (await read_n(reader, 1))[0]
    finally:
        await reader.close()


def payloads(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(count)]


class BackendConformance:
    """Contract tests; subclass as ``Test...`` to run them."""

    async def test_ids_increase_and_order_is_preserved(
        self, backend_factory: BackendCase, pchannel: str
    ) -> None:
        backend = await backend_factory()
        writer = await backend.open_writer(pchannel, 1)
        sent: list[bytes] = []
        acked: list[MessageID] = []
        for call in range(5):
            batch = payloads(f"c{call}", call + 1)
            ids = await writer.append(batch)
            assert len(ids) == len(batch)
            sent += batch
            acked += ids
        assert acked == sorted(acked) and len(set(acked)) == len(acked)
        records = await read_all(backend, pchannel, len(sent))
        assert [r.data for r in records] == sent
        assert [r.id for r in records] == acked
        assert await writer.append([]) == []

    async def test_records_of_one_call_are_contiguous(
        self, backend_factory: BackendCase, pchannel: str
    ) -> None:
        backend = await backend_factory()
        writer = await backend.open_writer(pchannel, 1)
        calls = [payloads(f"t{task}", 3 + task % 4) for task in range(12)]
        results = await asyncio.gather(*(writer.append(batch) for batch in calls))
        records = await read_all(backend, pchannel, sum(map(len, calls)))
        position = {r.id: index for index, r in enumerate(records)}
        for batch, ids in zip(calls, results, strict=True):
            first = position[ids[0]]
            assert [r.data for r in records[first : first + len(batch)]] == batch
            assert [r.id for r in records[first : first + len(batch)]] == ids

    async def test_reopen_reads_everything_back(
        self, backend_factory: BackendCase, pchannel: str
    ) -> None:
        backend = await backend_factory()
        writer = await backend.open_writer(pchannel, 1)
        first = await writer.append(payloads("a", 7))
        await writer.close()
        await backend.close()

        reopened = await backend_factory()
        records = await read_all(reopened, pchannel, 7)
        assert [r.id for r in records] == first
        assert [r.data for r in records] == payloads("a", 7)
        writer = await reopened.open_writer(pchannel, 2)
        more = await writer.append(payloads("b", 2))
        assert more[0] > first[-1]
        assert [r.data for r in await read_all(reopened, pchannel, 9)] == payloads(
            "a", 7
        ) + payloads("b", 2)

    async def test_concurrent_writers_tasks_and_readers_agree(
        self, backend_factory: BackendCase, pchannel: str
    ) -> None:
        backend = await backend_factory()
        writer = await backend.open_writer(pchannel, 1)
        rng = random.Random(7)
        plan = [[rng.randint(1, 5) for _ in range(15)] for _ in range(4)]
        total = sum(map(sum, plan))
        readers = [await backend.open_reader(pchannel, StartPosition.earliest()) for _ in range(3)]
        reading = [asyncio.create_task(read_n(reader, total)) for reader in readers]

        async def produce(task: int) -> list[MessageID]:
            acked: list[MessageID] = []
            for call, size in enumerate(plan[task]):
                acked += await writer.append(
                    [rng.randbytes(rng.randint(0, 300)) + f"{task}.{call}".encode()] * size
                )
            return acked

        acked = [mid for ids in await asyncio.gather(*map(produce, range(4))) for mid in ids]
        seen = await asyncio.gather(*reading)
        for reader in readers:
            await reader.close()
        final = await read_all(backend, pchannel, total)
        assert sorted(acked) == [r.id for r in final]
        for records in seen:
            assert records == final
        assert all(a.id < b.id for a, b in itertools.pairwise(final))

    async def test_start_positions(self, backend_factory: BackendCase, pchannel: str) -> None:
        backend = await backend_factory()
        writer = await backend.open_writer(pchannel, 1)
        ids = await writer.append(payloads("r", 5))
        latest = await backend.open_reader(pchannel, StartPosition.latest())

        assert (await first_record(backend, pchannel, StartPosition.earliest())).id == ids[0]
        assert (await first_record(backend, pchannel, StartPosition.at(ids[2]))).id == ids[2]
        assert (await first_record(backend, pchannel, StartPosition.after(ids[2]))).id == ids[3]
        at_tail = await backend.open_reader(
            pchannel, StartPosition.at(backend_factory.next_id(ids[-1]))
        )
        after_tail = await backend.open_reader(pchannel, StartPosition.after(ids[-1]))
        assert await latest.next_batch(timeout=0.05) == []
        assert await after_tail.next_batch(timeout=0.05) == []

        new = await writer.append([b"new"])
        for reader in (latest, at_tail, after_tail):
            record = (await read_n(reader, 1))[0]
            assert (record.id, record.data) == (new[0], b"new")
            await reader.close()

    async def test_start_at_an_id_between_records(
        self, backend_factory: BackendCase, pchannel: str
    ) -> None:
        if backend_factory.id_between is None:
            pytest.skip(f"{backend_factory.name} ids count records: no id lies between two")
        backend = await backend_factory()
        writer = await backend.open_writer(pchannel, 1)
        ids = await writer.append(payloads("g", 2))
        gap = backend_factory.id_between(ids[0], ids[1])
        if gap is None:
            pytest.skip(f"{backend_factory.name} wrote no gap between these records")
        assert ids[0] < gap < ids[1]
        assert (await first_record(backend, pchannel, StartPosition.at(gap))).id == ids[1]

    async def test_reader_waits_at_the_tail(
        self, backend_factory: BackendCase, pchannel: str
    ) -> None:
        backend = await backend_factory()
        writer = await backend.open_writer(pchannel, 1)
        await writer.append([b"one"])
        reader = await backend.open_reader(pchannel, StartPosition.earliest())
        assert [r.data for r in await read_n(reader, 1)] == [b"one"]
        assert await reader.next_batch(timeout=0.05) == []
        waiting = asyncio.create_task(reader.next_batch())
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await writer.append([b"two", b"three"])
        async with asyncio.timeout(WAIT):
            got = await waiting
        got += await read_n(reader, 2 - len(got))
        assert [r.data for r in got] == [b"two", b"three"]
        await reader.close()

    async def test_blocks_hold_the_same_records_as_batches(
        self, backend_factory: BackendCase, pchannel: str
    ) -> None:
        backend = await backend_factory()
        writer = await backend.open_writer(pchannel, 1)
        sent = [b"", *payloads("blk", 20), bytes(range(256)) * 40]
        ids = await writer.append(sent)
        expected = await read_all(backend, pchannel, len(sent))
        reader = await backend.open_reader(pchannel, StartPosition.at(ids[3]))
        got: list[Record] = []
        try:
            async with asyncio.timeout(WAIT):
                while len(got) < len(sent) - 3:
                    block = await reader.next_block(max_records=5)
                    assert 1 <= len(block) <= 5
                    assert len(block.bounds) == 2 * len(block.ids)
                    assert block.records() == [
                        Record(mid, block.data[block.bounds[2 * i] : block.bounds[2 * i + 1]])
                        for i, mid in enumerate(block.ids)
                    ]
                    got += block.records()
            assert len(await reader.next_block(timeout=0.05)) == 0
            assert (await reader.next_batch(timeout=0.05)) == []
        finally:
            await reader.close()
        assert got == expected[3:]
        assert [r.id for r in got] == ids[3:]

    async def test_blocks_and_batches_mix_on_one_reader(
        self, backend_factory: BackendCase, pchannel: str
    ) -> None:
        backend = await backend_factory()
        writer = await backend.open_writer(pchannel, 1)
        sent = payloads("mix", 12)
        await writer.append(sent)
        reader = await backend.open_reader(pchannel, StartPosition.earliest())
        got: list[bytes] = []
        try:
            async with asyncio.timeout(WAIT):
                for turn in itertools.count():
                    if len(got) == len(sent):
                        break
                    if turn % 2:
                        got += [r.data for r in await reader.next_batch(max_records=2)]
                    else:
                        got += [r.data for r in (await reader.next_block(max_records=3)).records()]
        finally:
            await reader.close()
        assert got == sent

    async def test_announced_ids_are_the_ids_of_the_next_append(
        self, backend_factory: BackendCase, pchannel: str
    ) -> None:
        backend = await backend_factory()
        writer = await backend.open_writer(pchannel, 1)
        announced = writer.next_ids(3)
        got = await writer.append(payloads("ann", 3))
        if announced is None:
            pytest.skip(f"{backend_factory.name} does not announce ids")
        assert got is announced
        stale = writer.next_ids(2)
        assert stale is not None
        other = await writer.append([b"one"])
        assert other is not stale
        after = await writer.append(payloads("after", 2))
        assert after is not stale and after[0] > other[0] > got[-1]
        records = await read_all(backend, pchannel, 6)
        assert [r.id for r in records] == [*got, *other, *after]

    async def test_lower_term_is_fenced(self, backend_factory: BackendCase, pchannel: str) -> None:
        backend = await backend_factory()
        old = await backend.open_writer(pchannel, 1)
        acked = await old.append(payloads("old", 3))
        new = await backend.open_writer(pchannel, 2)
        with pytest.raises(errors.Fenced) as fenced:
            await old.append([b"stale"])
        assert fenced.value.term == 1
        with pytest.raises(errors.Fenced):
            await backend.open_writer(pchannel, 1)
        more = await new.append(payloads("new", 2))
        assert more[0] > acked[-1]
        records = await read_all(backend, pchannel, 5)
        assert [r.data for r in records] == payloads("old", 3) + payloads("new", 2)

    async def test_fencing_holds_across_clients_and_reopen(
        self, backend_factory: BackendCase, pchannel: str
    ) -> None:
        first, second = await backend_factory(), await backend_factory()
        stale = await first.open_writer(pchannel, 3)
        acked = await stale.append(payloads("a", 2))
        owner = await second.open_writer(pchannel, 4)
        taken = await owner.append([b"b-0"])
        with pytest.raises(errors.Fenced):
            await stale.append([b"lost"])
        await owner.append([b"b-1"])
        third = await backend_factory()
        with pytest.raises(errors.Fenced) as fenced:
            await third.open_writer(pchannel, 3)
        assert fenced.value.current_term >= 4
        records = await read_all(third, pchannel, 4)
        assert [r.data for r in records] == [b"a-0", b"a-1", b"b-0", b"b-1"]
        assert records[1].id == acked[-1] and records[2].id == taken[0]

    async def test_same_term_reopen_continues_the_log(
        self, backend_factory: BackendCase, pchannel: str
    ) -> None:
        backend = await backend_factory()
        writer = await backend.open_writer(pchannel, 5)
        await writer.append([b"x"])
        await writer.close()
        writer = await backend.open_writer(pchannel, 5)
        await writer.append([b"y"])
        assert [r.data for r in await read_all(backend, pchannel, 2)] == [b"x", b"y"]

    async def test_truncate(self, backend_factory: BackendCase, pchannel: str) -> None:
        backend = await backend_factory()
        writer = await backend.open_writer(pchannel, 1)
        ids = await writer.append(payloads("t", 10))
        await backend.truncate(pchannel, ids[6])
        earliest = await backend.earliest(pchannel)
        assert earliest is not None and earliest <= ids[6]
        assert (await first_record(backend, pchannel, StartPosition.at(ids[6]))).data == b"t-6"
        reader = await backend.open_reader(pchannel, StartPosition.at(ids[6]))
        assert [r.data for r in await read_n(reader, 4)] == payloads("t", 10)[6:]
        await reader.close()
        if backend_factory.exact_truncation:
            assert earliest == ids[6]
            below = await backend.open_reader(pchannel, StartPosition.at(ids[2]))
            with pytest.raises(errors.Truncated) as truncated:
                await below.next_batch(timeout=1)
            assert truncated.value.earliest == str(ids[6])
            assert not truncated.value.retryable
            records = await read_all(backend, pchannel, 4)
            assert [r.id for r in records] == ids[6:]
        await backend.truncate(pchannel, ids[3])
        assert await backend.earliest(pchannel) == earliest
        assert (await backend.last_record(pchannel)) == Record(ids[-1], b"t-9")

    async def test_truncate_everything(self, backend_factory: BackendCase, pchannel: str) -> None:
        if not backend_factory.exact_truncation:
            pytest.skip(f"{backend_factory.name} keeps records past truncate (retention)")
        backend = await backend_factory()
        writer = await backend.open_writer(pchannel, 1)
        ids = await writer.append(payloads("gone", 3))
        await backend.truncate(pchannel, backend_factory.next_id(backend_factory.next_id(ids[-1])))
        assert await backend.earliest(pchannel) is None
        assert await backend.last_record(pchannel) is None
        reader = await backend.open_reader(pchannel, StartPosition.earliest())
        assert await reader.next_batch(timeout=0.05) == []
        (new,) = await writer.append([b"kept"])
        assert new > ids[-1]
        assert await backend.earliest(pchannel) == new
        assert [(r.id, r.data) for r in await read_n(reader, 1)] == [(new, b"kept")]
        await reader.close()

    async def test_last_record_and_earliest(
        self, backend_factory: BackendCase, pchannel: str
    ) -> None:
        backend = await backend_factory()
        assert await backend.last_record(pchannel) is None
        assert await backend.earliest(pchannel) is None
        writer = await backend.open_writer(pchannel, 1)
        assert await backend.last_record(pchannel) is None
        assert await backend.earliest(pchannel) is None
        ids = await writer.append([b"first", b"second"])
        assert await backend.last_record(pchannel) == Record(ids[1], b"second")
        assert await backend.earliest(pchannel) == ids[0]
        other = await backend_factory()
        assert await other.last_record(pchannel) == Record(ids[1], b"second")

    async def test_pchannels_are_independent(
        self, backend_factory: BackendCase, pchannel: str
    ) -> None:
        backend = await backend_factory()
        one, two = f"{pchannel}-1", f"{pchannel}-2"
        first = await backend.open_writer(one, 7)
        second = await backend.open_writer(two, 1)
        await first.append([b"one"])
        await second.append([b"two-a", b"two-b"])
        await backend.open_writer(two, 2)
        await first.append([b"one-more"])
        assert [r.data for r in await read_all(backend, one, 2)] == [b"one", b"one-more"]
        assert [r.data for r in await read_all(backend, two, 2)] == [b"two-a", b"two-b"]
        assert await backend.last_record(f"{pchannel}-3") is None

    async def test_large_records_round_trip(
        self, backend_factory: BackendCase, pchannel: str
    ) -> None:
        backend = await backend_factory()
        writer = await backend.open_writer(pchannel, 1)
        rng = random.Random(3)
        big = [rng.randbytes(1024 * 1024 - i) for i in range(3)]
        sent = [b"small", *big[:2], b"", big[2]]
        ids = await writer.append(sent[:3])
        ids += await writer.append(sent[3:])
        records = await read_all(backend, pchannel, len(sent))
        assert [r.data for r in records] == sent
        assert [r.id for r in records] == ids

    async def test_closing_the_backend_wakes_waiting_readers(
        self, backend_factory: BackendCase, pchannel: str
    ) -> None:
        backend = await backend_factory()
        await backend.open_writer(pchannel, 1)
        reader = await backend.open_reader(pchannel, StartPosition.earliest())
        waiting = asyncio.create_task(reader.next_batch())
        await asyncio.sleep(0.05)
        await backend.close()
        async with asyncio.timeout(WAIT):
            with pytest.raises(errors.Closed):
                await waiting

    async def test_closed_writer_and_bad_arguments(
        self, backend_factory: BackendCase, pchannel: str
    ) -> None:
        backend = await backend_factory()
        with pytest.raises(errors.InvalidArgument):
            await backend.open_writer(pchannel, -1)
        writer = await backend.open_writer(pchannel, 1)
        await writer.close()
        await writer.close()
        with pytest.raises(errors.Closed) as closed:
            await writer.append([b"late"])
        assert closed.value.retryable
        reader = await backend.open_reader(pchannel, StartPosition.earliest())
        with pytest.raises(errors.InvalidArgument):
            await reader.next_batch(max_records=0)
        await reader.close()
