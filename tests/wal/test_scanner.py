"""Scanners: deliver policies, filters, catch-up -> tail switching, eviction, resume."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace import errors
from headrace.message import codec
from headrace.message.types import LogEntry, Message, MessageType
from headrace.tso import LocalTSO
from headrace.wal import registry
from headrace.wal.api import AppendResult, DeliverPolicy, ReadOptions
from headrace.wal.buffer import ENTRY_OVERHEAD
from headrace.wal.contract import Backend, StartPosition
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.scanner import Scanner, open_backend_scanner
from tests.wal.delegating import CountingBackend

QUIET = WALOptions(timetick_interval_ms=3_600_000)
DATA = [MessageType.INSERT, MessageType.DELETE]


def msg(vchannel: str, payload: bytes, kind: MessageType = MessageType.INSERT) -> Message:
    return Message(kind, vchannel, payload)


async def take(scanner: Scanner, n: int) -> list[LogEntry]:
    out: list[LogEntry] = []
    for _ in range(n):
        entry = await scanner.next(timeout=10)
        assert entry is not None, f"only {len(out)} of {n} entries arrived"
        out.append(entry)
    return out


async def drain_available(scanner: Scanner) -> list[LogEntry]:
    out = []
    while (entry := await scanner.next(timeout=0.05)) is not None:
        out.append(entry)
    return out


async def backend_log(backend: Backend, pchannel: str = "p") -> list[LogEntry]:
    reader = await backend.open_reader(pchannel, StartPosition.earliest())
    out: list[LogEntry] = []
    try:
        while records := await reader.next_batch(1024, timeout=0):
            out += [LogEntry(r.id, codec.decode(r.data)) for r in records]
    finally:
        await reader.close()
    return out


async def append_all(wal: WAL, msgs: Sequence[Message]) -> list[AppendResult]:
    out = []
    for r in await wal.append_many(msgs):
        assert isinstance(r, AppendResult)
        out.append(r)
    return out


@pytest.fixture(params=["memory", "local"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """The memory backend, and the local one on a temporary directory."""
    created = (
        registry.create(request.param, root=str(tmp_path))
        if request.param == "local"
        else (registry.create("memory"))
    )
    yield created
    await created.close()


async def test_deliver_all_from_the_buffer_and_from_the_backend(backend: Backend) -> None:
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    await append_all(wal, [msg("a", b"%d" % i) for i in range(5)])
    await wal.close()
    wal = await WAL.open(backend, "p", 2, tso=LocalTSO(), options=QUIET)
    await append_all(wal, [msg("a", b"%d" % i) for i in range(5, 8)])
    scanner = wal.read(ReadOptions())
    assert scanner.mode == "catchup"
    log = await backend_log(backend)
    assert len(log) == 11, "fence, 5, final tick; fence, 3"
    got = await take(scanner, len(log))
    assert got == log
    assert await scanner.next(timeout=0.01) is None
    assert scanner.mode == "tail"
    new = await wal.append(msg("a", b"8"))
    entry = await scanner.next(timeout=10)
    assert entry is not None and entry.id == new.id
    await scanner.close()
    await wal.close()


async def test_latest_delivers_only_later_appends(backend: Backend) -> None:
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    await append_all(wal, [msg("a", b"old")])
    scanner = wal.read(ReadOptions(policy=DeliverPolicy.LATEST))
    assert scanner.mode == "tail"
    assert await scanner.next(timeout=0.01) is None
    new = await wal.append(msg("a", b"new"))
    entry = await scanner.next(timeout=10)
    assert entry is not None and entry.id == new.id and entry.message.payload == b"new"
    await scanner.close()
    await wal.close()


async def test_backend_scanner_latest_waits_at_the_tail(backend: Backend) -> None:
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    await append_all(wal, [msg("a", b"old")])
    scanner = await open_backend_scanner(backend, "p", ReadOptions(policy=DeliverPolicy.LATEST))
    assert scanner.mode == "catchup"
    assert await scanner.next(timeout=0.01) is None
    await wal.append(msg("a", b"new"))
    entry = await scanner.next(timeout=10)
    assert entry is not None and entry.message.payload == b"new"
    await scanner.close()
    await wal.close()


@pytest.mark.parametrize("tiny_buffer", [False, True])
async def test_start_from_and_start_after(backend: Backend, tiny_buffer: bool) -> None:
    options = WALOptions(timetick_interval_ms=3_600_000, buffer_bytes=1 if tiny_buffer else 1 << 20)
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=options)
    results = await append_all(wal, [msg("a", b"%d" % i) for i in range(6)])
    from_third = wal.read(ReadOptions(policy=DeliverPolicy.START_FROM, start_id=results[2].id))
    after_third = wal.read(ReadOptions(policy=DeliverPolicy.START_AFTER, start_id=results[2].id))
    expected_mode = "catchup" if tiny_buffer else "tail"
    assert from_third.mode == after_third.mode == expected_mode
    got_from = await take(from_third, 4)
    got_after = await take(after_third, 3)
    assert [e.id for e in got_from] == [r.id for r in results[2:]]
    assert [e.id for e in got_after] == [r.id for r in results[3:]]
    for scanner in (from_third, after_third):
        assert await scanner.next(timeout=0.01) is None
        await scanner.close()
    await wal.close()


async def test_filters_by_vchannel_type_and_timetick(backend: Backend) -> None:
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    a1, _, a2, _ = await append_all(
        wal,
        [
            msg("a", b"a1"),
            msg("b", b"b1"),
            msg("a", b"a2", MessageType.DELETE),
            msg("c", b"c1"),
        ],
    )
    by_vch = await drain_available(wal.read(ReadOptions(vchannels=["a"])))
    assert [e.message.payload for e in by_vch] == [b"", b"a1", b"a2"], "fence goes to everyone"
    assert by_vch[0].message.type is MessageType.FENCE
    by_type = await drain_available(wal.read(ReadOptions(types=[MessageType.DELETE])))
    assert [e.message.payload for e in by_type] == [b"a2"]
    gt = await drain_available(wal.read(ReadOptions(timetick_gt=a1.timetick)))
    assert [e.message.payload for e in gt] == [b"b1", b"a2", b"c1"]
    ge = await drain_available(wal.read(ReadOptions(timetick_ge=a2.timetick, vchannels=["a", "c"])))
    assert [e.message.payload for e in ge] == [b"a2", b"c1"]
    await wal.close()


async def test_resume_after_a_position_delivers_exactly_what_follows(backend: Backend) -> None:
    wal = await WAL.open(
        backend, "p", 1, tso=LocalTSO(), options=WALOptions(timetick_interval_ms=2)
    )
    first = wal.read(ReadOptions())
    await wal.append(msg("a", b"1"))
    seen: list[LogEntry] = []
    idle_ticks = 0
    while idle_ticks < 3:
        entry = await first.next(timeout=10)
        assert entry is not None
        seen.append(entry)
        if (
            entry.message.type is MessageType.TIME_TICK
            and len(seen) > 2
            and entry.id == seen[-2].id
        ):
            idle_ticks += 1
    await first.close()
    last = seen[-1]
    assert last.message.type is MessageType.TIME_TICK
    resumed = wal.read(
        ReadOptions(
            policy=DeliverPolicy.START_AFTER, start_id=last.id, timetick_gt=last.message.timetick
        )
    )
    new = await wal.append(msg("a", b"2"))
    got: list[LogEntry] = []
    while not got or got[-1].id != new.id:
        entry = await resumed.next(timeout=10)
        assert entry is not None
        got.append(entry)
    ticks = [e.message.timetick for e in seen + got]
    assert ticks == sorted(ticks) and len(set(ticks)) == len(ticks), "no duplicate, in order"
    assert all(e.message.timetick > last.message.timetick for e in got)
    await resumed.close()
    await wal.close()


async def test_catchup_switches_to_tail_without_gap_or_duplicate(backend: Backend) -> None:
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    for i in range(0, 300, 50):
        await append_all(wal, [msg("a", b"%d" % j) for j in range(i, i + 50)])
    await wal.close()
    wal = await WAL.open(backend, "p", 2, tso=LocalTSO(), options=WALOptions(read_batch=7))
    scanner = wal.read(ReadOptions(types=DATA))
    assert scanner.mode == "catchup"

    async def produce() -> None:
        for i in range(300, 600, 10):
            await append_all(wal, [msg("a", b"%d" % j) for j in range(i, i + 10)])
            await asyncio.sleep(0)

    producer = asyncio.create_task(produce())
    got = await take(scanner, 600)
    await producer
    assert scanner.mode == "tail"
    assert [e.message.payload for e in got] == [b"%d" % i for i in range(600)]
    assert await scanner.next(timeout=0.01) is None
    await scanner.close()
    await wal.close()


async def test_eviction_falls_back_to_catchup_and_returns_to_tail(backend: Backend) -> None:
    # Room for a few entries (each costs at least ENTRY_OVERHEAD), far fewer
    # than a round's 40: a tick persisted behind the last append still leaves
    # that append in the buffer.
    options = WALOptions(buffer_bytes=4 * ENTRY_OVERHEAD)
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=options)
    scanner = wal.read(ReadOptions(policy=DeliverPolicy.LATEST, types=DATA))
    assert scanner.mode == "tail"
    modes = set()
    expected = []
    for round_ in range(5):
        batch = [msg("a", b"%d-%d" % (round_, i)) for i in range(40)]
        expected += [m.payload for m in batch]
        await append_all(wal, batch)
        for _ in range(40):
            entry = await scanner.next(timeout=10)
            assert entry is not None
            modes.add(scanner.mode)
            assert entry.message.payload == expected.pop(0)
        assert await scanner.next(timeout=0.01) is None
        assert scanner.mode == "tail", "caught up again"
    assert "catchup" in modes, "evicted entries were read from the backend"
    await wal.append(msg("a", b"end"))
    entry = await scanner.next(timeout=10)
    assert entry is not None and entry.message.payload == b"end" and scanner.mode == "tail"
    await scanner.close()
    await wal.close()


async def test_reading_a_truncated_position_names_the_earliest_id(backend: Backend) -> None:
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=WALOptions(buffer_bytes=1))
    results = await append_all(wal, [msg("a", b"%d" % i) for i in range(10)])
    await backend.truncate("p", results[5].id)
    scanner = wal.read(ReadOptions(policy=DeliverPolicy.START_FROM, start_id=results[1].id))
    with pytest.raises(errors.Truncated) as info:
        await scanner.next(timeout=10)
    assert info.value.earliest == str(await backend.earliest("p"))
    assert str(results[5].id) in str(info.value)
    await scanner.close()
    whole = wal.read(ReadOptions(types=DATA))
    assert [e.id for e in await take(whole, 5)] == [r.id for r in results[5:]], "ALL: what is kept"
    await whole.close()
    ok = wal.read(ReadOptions(policy=DeliverPolicy.START_FROM, start_id=results[6].id))
    assert [e.id for e in await take(ok, 4)] == [r.id for r in results[6:]]
    await ok.close()
    await wal.close()


async def test_scanner_reads_ahead_a_bounded_amount(backend: Backend) -> None:
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    await append_all(wal, [msg("a", b"%d" % i) for i in range(500)])
    await wal.close()
    counting = CountingBackend(backend)
    scanner = await open_backend_scanner(counting, "p", ReadOptions(), batch_size=16)
    await take(scanner, 20)
    assert 20 <= counting.fetched <= 20 + 16
    await scanner.close()
    with pytest.raises(errors.Closed):
        await scanner.next()


async def test_async_iteration_and_context_manager(backend: Backend) -> None:
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    await append_all(wal, [msg("a", b"%d" % i) for i in range(3)])
    payloads = []
    async with wal.read(ReadOptions(types=DATA)) as scanner:
        async for entry in scanner:
            payloads.append(entry.message.payload)
            if len(payloads) == 3:
                await scanner.close()
    assert payloads == [b"0", b"1", b"2"]
    closing = wal.read(ReadOptions(types=DATA))
    await wal.close()
    got = [e.message.payload async for e in _until_closed(closing)]
    assert got == [b"0", b"1", b"2"], "a WAL that stops serving ends its tail readers"


async def _until_closed(scanner: Scanner) -> AsyncIterator[LogEntry]:
    while True:
        try:
            entry = await scanner.next(timeout=10)
        except errors.Closed:
            return
        assert entry is not None
        yield entry


Op = tuple[str, int]
OPS = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 6)),
    st.tuples(st.just("read"), st.integers(1, 10)),
    st.tuples(st.just("reopen"), st.just(0)),
    st.tuples(st.sampled_from(["begin", "commit", "rollback", "ddl"]), st.just(0)),
    st.tuples(st.just("body"), st.integers(1, 3)),
)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ops=st.lists(OPS, max_size=30),
    vchannels=st.sets(st.sampled_from(["a", "b", "c"])),
    buffer_bytes=st.sampled_from([1, 400, 1 << 20]),
)
def test_random_interleavings_deliver_the_appended_sequence(
    ops: list[Op], vchannels: set[str], buffer_bytes: int
) -> None:
    """Plain appends, transactions, DDLs, reads and handoffs in any order: a
    reader (resumed across handoffs) gets exactly the committed data, in order."""
    asyncio.run(Interleaving(vchannels, buffer_bytes).run(ops))


class Interleaving:
    def __init__(self, vchannels: set[str], buffer_bytes: int) -> None:
        self.backend = registry.create("memory")
        self.options = WALOptions(
            timetick_interval_ms=3_600_000, buffer_bytes=buffer_bytes, read_batch=3
        )
        self.filter = ReadOptions(vchannels=sorted(vchannels), types=DATA)
        self.vchannels = vchannels
        self.term = 1
        self.counter = 0
        self.expected: list[bytes] = []
        self.delivered: list[bytes] = []
        self.txn: tuple[int, str, list[bytes]] | None = None

    def wanted(self, vchannel: str) -> bool:
        return not self.vchannels or vchannel in self.vchannels

    def fresh(self) -> tuple[str, bytes]:
        self.counter += 1
        return "abc"[self.counter % 3], b"%d" % self.counter

    async def run(self, ops: list[Op]) -> None:
        wal = await WAL.open(self.backend, "p", self.term, tso=LocalTSO(), options=self.options)
        scanner = wal.read(self.filter)
        for op, n in ops:
            if op == "read":
                for _ in range(n):
                    entry = await scanner.next(timeout=0.01)
                    if entry is None:
                        break
                    self.delivered.append(entry.message.payload)
            elif op == "reopen":
                resume = scanner.resume_options()
                await scanner.close()
                await wal.close()
                self.term += 1
                self.txn = None
                wal = await WAL.open(
                    self.backend, "p", self.term, tso=LocalTSO(), options=self.options
                )
                scanner = wal.read(resume)
            else:
                await self.write(wal, op, n)
        while (entry := await scanner.next(timeout=0.01)) is not None:
            self.delivered.append(entry.message.payload)
        assert self.delivered == self.expected
        await scanner.close()
        await wal.close()

    async def write(self, wal: WAL, op: str, n: int) -> None:
        if op == "append":
            batch = [msg(*self.fresh()) for _ in range(n)]
            await append_all(wal, batch)
            self.expected += [m.payload for m in batch if self.wanted(m.vchannel)]
        elif op == "begin" and self.txn is None:
            vchannel, _ = self.fresh()
            begun = await wal.append(Message(MessageType.BEGIN_TXN, vchannel))
            self.txn = (begun.txn_id, vchannel, [])
        elif op == "body" and self.txn is not None:
            txn_id, vchannel, payloads = self.txn
            for _ in range(n):
                payload = self.fresh()[1]
                await wal.append(Message(MessageType.INSERT, vchannel, payload, txn_id=txn_id))
                payloads.append(payload)
        elif op in ("commit", "rollback") and self.txn is not None:
            txn_id, vchannel, payloads = self.txn
            kind = MessageType.COMMIT_TXN if op == "commit" else MessageType.ROLLBACK_TXN
            await wal.append(Message(kind, vchannel, txn_id=txn_id))
            if op == "commit" and self.wanted(vchannel):
                self.expected += payloads
            self.txn = None
        elif op == "ddl":
            await wal.append(Message(MessageType.DROP_PARTITION, "a"))
            if self.txn is not None and self.txn[1] == "a":
                with pytest.raises(errors.TxnAborted):
                    await wal.append(Message(MessageType.COMMIT_TXN, "a", txn_id=self.txn[0]))
                self.txn = None
