"""Appending record batches (message format 2): one record, consecutive timeticks, one
dedup key per batch; refusals named; the per-message path for what needs it.

Batches of several messages need message ids with an index
(``MessageID.with_index``); the tests of them are skipped until ids have it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from pathlib import Path

import pytest

from headrace import errors
from headrace.message import batch
from headrace.message.batch import BatchInfo
from headrace.message.formats import FormatSupport
from headrace.message.ids import MessageID
from headrace.message.records import message_id
from headrace.message.types import Message, MessageType
from headrace.tso import LocalTSO
from headrace.wal import registry
from headrace.wal.api import (
    AppendResult,
    BatchAppendResult,
    DeliverPolicy,
    ReadOptions,
)
from headrace.wal.contract import Backend, BackendWriter, Record, StartPosition
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.memory import MemoryBackend
from tests.wal.delegating import DelegatingBackend

BATCHES = FormatSupport.of(reads={1, 2}, writes={1, 2})
"""A release that writes record batches (this one's RELEASE_FORMATS does not yet)."""
QUIET = WALOptions(timetick_interval_ms=3_600_000, message_format=2, release_formats=BATCHES)
WAIT = 10.0


def rows(vchannel: str, n: int, tag: str = "r", txn_id: int = 0) -> list[Message]:
    return [
        Message(MessageType.INSERT, vchannel, b"%s-%d" % (tag.encode(), i), txn_id=txn_id)
        for i in range(n)
    ]


def encoded(
    msgs: Sequence[Message], producer_id: int = 0, sequence: int = 0, txn_id: int = 0
) -> bytes:
    return batch.encode(msgs, BatchInfo(msgs[0].vchannel, producer_id, sequence, txn_id))


def results(
    outcomes: Sequence[BatchAppendResult | errors.HeadraceError],
) -> list[BatchAppendResult]:
    assert all(isinstance(r, BatchAppendResult) for r in outcomes), outcomes
    return [r for r in outcomes if isinstance(r, BatchAppendResult)]


async def stored(backend: Backend, pchannel: str = "p") -> list[Record]:
    """Every record of ``pchannel``, in order."""
    last = await backend.last_record(pchannel)
    if last is None:
        return []
    out: list[Record] = []
    reader = await backend.open_reader(pchannel, StartPosition.earliest())
    try:
        while not out or out[-1].id < last.id:
            got = await reader.next_batch(1024, timeout=WAIT)
            assert got, "the reader stalled before the last record"
            out += got
    finally:
        await reader.close()
    return out


def data_batches(records: list[Record]) -> list[batch.BatchHeader]:
    """The headers of the stored records that are not the WAL's own ticks or fences."""
    headers = [batch.read_header(r.data) for r in records]
    return [h for h in headers if not h.system]


def backend_of(kind: str, tmp_path: Path) -> Backend:
    if kind == "local":
        return registry.create("local", root=str(tmp_path))
    return registry.create("memory")


async def open_wal(backend: Backend, term: int = 1, options: WALOptions = QUIET) -> WAL:
    return await WAL.open(backend, "p", term, tso=LocalTSO(), options=options)


@pytest.mark.parametrize("kind", ["memory", "local"])
async def test_a_batch_is_one_record_with_consecutive_ids_and_timeticks(
    kind: str, tmp_path: Path
) -> None:
    backend = backend_of(kind, tmp_path)
    wal = await open_wal(backend)
    sizes = [5, 1, 3]
    outcomes = results(await wal.append_batches([encoded(rows("v", n, f"b{n}")) for n in sizes]))
    await wal.close()
    assert [r.count for r in outcomes] == sizes
    for result in outcomes:
        message_ids = result.message_ids()
        assert message_ids[0] == result.record_id
        assert [m.record_id() for m in message_ids] == [result.record_id] * result.count
        assert [m.index for m in message_ids] == list(range(result.count))
    ticks = [t for r in outcomes for t in (m.timetick for m in r.results())]
    assert ticks == sorted(set(ticks)), "every message its own timetick, in order"
    assert [(m.id, m.timetick - r.timetick) for r in outcomes for m in r.results()] == [
        (mid, i) for r in outcomes for i, mid in enumerate(r.message_ids())
    ]
    records = await stored(backend)
    headers = data_batches(records)
    assert [h.count for h in headers] == sizes, "one backend record per batch"
    by_id = {r.id: batch.read_header(r.data) for r in records}
    for result in outcomes:
        assert by_id[result.record_id].base_timetick == result.timetick
        assert by_id[result.record_id].term == 1
    stamped = batch.messages(next(r.data for r in records if r.id == outcomes[0].record_id))
    assert [m.payload for m in stamped] == [m.payload for m in rows("v", 5, "b5")]
    first = outcomes[0].timetick
    assert [m.timetick for m in stamped] == [first + i for i in range(5)]


@pytest.mark.parametrize("kind", ["memory", "local"])
async def test_a_batch_of_one_message_is_one_record(kind: str, tmp_path: Path) -> None:
    backend = backend_of(kind, tmp_path)
    wal = await open_wal(backend)
    outcomes = results(await wal.append_batches([encoded(rows("v", 1, t)) for t in "abc"]))
    await wal.close()
    assert [r.count for r in outcomes] == [1, 1, 1]
    assert [r.message_ids() for r in outcomes] == [[r.record_id] for r in outcomes]
    headers = data_batches(await stored(backend))
    assert [h.count for h in headers] == [1, 1, 1]
    assert [h.base_timetick for h in headers] == [r.timetick for r in outcomes]


async def test_tail_readers_get_the_messages_of_a_batch() -> None:
    wal = await open_wal(MemoryBackend())
    scanner = wal.read(ReadOptions(policy=DeliverPolicy.LATEST))
    await scanner.open()
    (result,) = results(await wal.append_batches([encoded(rows("v", 1, "tail"))]))
    async with asyncio.timeout(WAIT):
        entry = await scanner.next()
        while entry is not None and entry.message.type is not MessageType.INSERT:
            entry = await scanner.next()
    assert entry is not None
    assert (entry.id, entry.message.payload) == (result.record_id, b"tail-0")
    assert (entry.message.timetick, entry.message.term) == (result.timetick, 1)
    await scanner.close()
    await wal.close()


async def test_a_retried_batch_gets_the_first_result_and_is_stored_once() -> None:
    backend = MemoryBackend()
    wal = await open_wal(backend)
    first = encoded(rows("v", 1, "once"), producer_id=77, sequence=1)
    other = encoded(rows("v", 1, "other"), producer_id=77, sequence=2)
    (a,) = results(await wal.append_batches([first]))
    again, b = results(await wal.append_batches([first, other]))
    assert again == a
    assert b != a
    # Concurrent copies while the first is in flight: one write.
    third = encoded(rows("v", 1, "racing"), producer_id=77, sequence=3)
    outcomes = await asyncio.gather(*(wal.append_batches([third]) for _ in range(4)))
    racing = {results(o)[0] for o in outcomes}
    assert len(racing) == 1
    await wal.close()
    payloads = [batch.messages(r.data)[0].payload for r in await stored(backend)]
    payloads = [p for p in payloads if p]
    assert payloads == [b"once-0", b"other-0", b"racing-0"]


async def test_a_keyed_batch_is_deduplicated_whatever_follows_it_in_the_call() -> None:
    """One call mixing keyed and unkeyed batches (in either order) goes through
    the dedup stage: a retry of the keyed one is written once."""
    backend = MemoryBackend()
    wal = await open_wal(backend)
    keyed = encoded(rows("v", 2, "keyed"), producer_id=9, sequence=1)
    free = encoded(rows("v", 1, "free"))
    first, _ = results(await wal.append_batches([keyed, free]))
    _, again = results(await wal.append_batches([free, keyed]))
    retried, _ = results(await wal.append_batches([keyed, free]))
    assert again == first and retried == first
    await wal.close()
    payloads = [batch.messages(r.data)[0].payload for r in await stored(backend)]
    assert [p for p in payloads if p] == [b"keyed-0", b"free-0", b"free-0", b"free-0"]


async def test_producer_id_zero_is_not_deduplicated() -> None:
    backend = MemoryBackend()
    wal = await open_wal(backend)
    same = encoded(rows("v", 1, "free"))
    a, b = results(await wal.append_batches([same, same]))
    assert a.record_id != b.record_id
    await wal.close()
    assert len(data_batches(await stored(backend))) == 2


async def test_a_retry_is_known_by_its_key_alone() -> None:
    wal = await open_wal(MemoryBackend())
    results(await wal.append_batches([encoded(rows("v", 1, "x"), producer_id=5, sequence=9)]))
    (reuse,) = await wal.append_batches(
        [encoded([Message(MessageType.DELETE, "v", b"k")], producer_id=5, sequence=9)]
    )
    # Same key, same count: the first result (a retry's content is not compared).
    assert isinstance(reuse, BatchAppendResult)
    await wal.close()


async def test_a_sequence_reused_with_another_count_is_refused() -> None:
    wal = await open_wal(MemoryBackend())
    results(await wal.append_batches([encoded(rows("v", 1, "x"), producer_id=5, sequence=9)]))
    (reuse,) = await wal.append_batches([encoded(rows("v", 2, "y"), producer_id=5, sequence=9)])
    assert isinstance(reuse, errors.InvalidArgument)
    assert "acknowledged for 1 messages" in reuse.message and "holds 2" in reuse.message
    await wal.close()


@pytest.mark.parametrize("kind", ["memory", "local"])
@pytest.mark.parametrize("crash", [False, True])
async def test_dedup_of_batches_survives_a_reopen(kind: str, crash: bool, tmp_path: Path) -> None:
    """The new owner rebuilds the window from batch headers: after a handoff
    (the log ends with the old owner's last tick) or a crash (it ends with data)."""
    backend = backend_of(kind, tmp_path)
    first = await open_wal(backend)
    key = 2**64 - 1
    sent = [encoded(rows("v", 1, f"k{i}"), producer_id=key, sequence=i) for i in range(30)]
    acked = results(await first.append_batches(sent))
    if not crash:
        await first.close()  # else left open: no final tick, the log ends with data
    second = await open_wal(backend, term=2)
    again = results(await second.append_batches(sent[-10:] + sent[:3]))
    assert again == acked[-10:] + acked[:3]
    fresh = encoded(rows("v", 1, "new"), producer_id=key, sequence=30)
    (new,) = results(await second.append_batches([fresh]))
    assert new.term == 2
    await second.close()
    if crash:
        await first.close()
    headers = data_batches(await stored(backend))
    assert len(headers) == 31, "the retries wrote nothing"


async def test_good_and_bad_batches_in_one_call() -> None:
    backend = MemoryBackend()
    wal = await open_wal(backend)
    good = encoded(rows("v", 1, "good"))
    damaged = bytearray(encoded(rows("v", 1, "bad")))
    damaged[-1] ^= 0xFF
    stamped = bytearray(encoded(rows("v", 1, "stamped")))
    batch.stamp(stamped, 5, 1)
    outcomes = await wal.append_batches([good, bytes(damaged), bytes(stamped), good, b"junk"])
    assert isinstance(outcomes[0], BatchAppendResult)
    assert isinstance(outcomes[1], errors.InvalidArgument)
    assert "malformed record batch: batch CRC mismatch" in outcomes[1].message
    assert isinstance(outcomes[2], errors.InvalidArgument) and "timetick 5" in outcomes[2].message
    assert isinstance(outcomes[3], BatchAppendResult)
    assert outcomes[3].timetick > outcomes[0].timetick
    assert isinstance(outcomes[4], errors.InvalidArgument)
    await wal.close()
    assert len(data_batches(await stored(backend))) == 2, "nothing written for a refused batch"


def _system_batch() -> bytes:
    return batch.encode(rows("v", 1), BatchInfo("v", system=True))


REFUSALS: list[tuple[str, bytes, type[errors.HeadraceError], str]] = [
    (
        "damaged",
        encoded(rows("v", 1))[:-1],
        errors.InvalidArgument,
        "malformed record batch: batch length",
    ),
    ("system flag", _system_batch(), errors.InvalidArgument, "flagged system"),
    (
        "bad vchannel",
        encoded(rows("-bad", 1)),
        errors.InvalidArgument,
        "invalid vchannel '-bad'",
    ),
    (
        "no vchannel",
        batch.encode([Message(MessageType.INSERT, "", b"x")], BatchInfo("")),
        errors.InvalidArgument,
        "invalid vchannel ''",
    ),
    (
        "system type",
        encoded([Message(MessageType.FENCE, "v", b"")]),
        errors.InvalidArgument,
        "message 0 of the batch: FENCE messages are written by the WAL itself",
    ),
    (
        "message too large",
        encoded([Message(MessageType.INSERT, "v", b"x" * 1500)]),
        errors.MessageTooLarge,
        "message 0 of the batch: message of 1537 bytes (payload 1500) exceeds the maximum "
        "of 1024 bytes",
    ),
    (
        "batch too large",
        encoded([Message(MessageType.INSERT, "v", b"x" * 900)] * 3),
        errors.MessageTooLarge,
        "exceeds the maximum of 2048 bytes; nothing was written",
    ),
    (
        "DDL among others",
        encoded([Message(MessageType.INSERT, "v", b"x"), Message(MessageType.DROP_PARTITION, "v")]),
        errors.InvalidArgument,
        "send them one per batch (this one holds 2 messages)",
    ),
    (
        "txn control among others",
        encoded(
            [
                Message(MessageType.INSERT, "v", b"x", txn_id=3),
                Message(MessageType.COMMIT_TXN, "v", txn_id=3),
            ],
            txn_id=3,
        ),
        errors.InvalidArgument,
        "transaction control (BEGIN/COMMIT/ROLLBACK_TXN)",
    ),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c[0] for c in REFUSALS])
async def test_every_refusal_names_its_cause_and_writes_nothing(
    case: tuple[str, bytes, type[errors.HeadraceError], str],
) -> None:
    _name, data, kind, text = case
    backend = MemoryBackend()
    options = WALOptions(
        timetick_interval_ms=3_600_000,
        message_format=2,
        release_formats=BATCHES,
        max_message_bytes=1024,
        max_batch_bytes=2048,
    )
    wal = await open_wal(backend, options=options)
    (outcome,) = await wal.append_batches([data])
    assert type(outcome) is kind, outcome
    assert text in outcome.message, outcome.message
    await wal.close()
    assert data_batches(await stored(backend)) == []


async def test_a_wal_writing_format_1_refuses_batches_naming_both_formats() -> None:
    wal = await WAL.open(MemoryBackend(), "p", 1, tso=LocalTSO(), options=WALOptions())
    (outcome,) = await wal.append_batches([encoded(rows("v", 1))])
    assert isinstance(outcome, errors.InvalidArgument)
    assert "writes message format 1" in outcome.message
    assert "message format 2" in outcome.message
    await wal.close()


def test_a_release_that_cannot_write_format_2_refuses_the_option() -> None:
    with pytest.raises(errors.InvalidArgument, match="cannot write"):
        WALOptions(message_format=2, release_formats=FormatSupport.of({1}, {1}))


async def test_what_needs_the_per_message_path_goes_alone_with_its_own_result() -> None:
    """A transaction's control messages and a DDL travel decoded, one per batch;
    the transaction's body batch goes whole through the txn stage."""
    backend = MemoryBackend()
    wal = await open_wal(backend)
    begin = encoded([Message(MessageType.BEGIN_TXN, "v")])
    (begun,) = results(await wal.append_batches([begin]))
    txn = begun.txn_id
    assert txn and begun.count == 1
    body, stray = await wal.append_batches(
        [
            encoded(rows("v", 1, "t", txn_id=txn), txn_id=txn),
            encoded(rows("v", 1, "s", txn_id=99), txn_id=99),
        ]
    )
    assert isinstance(body, BatchAppendResult) and body.txn_id == txn
    assert isinstance(stray, errors.TxnAborted), stray
    commit = encoded([Message(MessageType.COMMIT_TXN, "v", txn_id=txn)], txn_id=txn)
    (committed,) = results(await wal.append_batches([commit]))
    assert committed.txn_id == txn and committed.timetick > body.timetick
    (late,) = await wal.append_batches([encoded(rows("v", 1, "late", txn_id=txn), txn_id=txn)])
    assert isinstance(late, errors.TxnAborted), "the body stage saw the commit"
    ddl = encoded([Message(MessageType.DROP_PARTITION, "v")])
    (dropped,) = results(await wal.append_batches([ddl]))
    await wal.close()
    headers = data_batches(await stored(backend))
    assert [(h.txn_id, h.count) for h in headers] == [(txn, 1), (txn, 1), (txn, 1), (0, 1)]
    assert dropped.timetick > committed.timetick


async def test_a_transaction_body_of_several_messages_goes_whole() -> None:
    backend = MemoryBackend()
    wal = await open_wal(backend)
    (begun,) = results(await wal.append_batches([encoded([Message(MessageType.BEGIN_TXN, "v")])]))
    txn = begun.txn_id
    (body,) = results(
        await wal.append_batches([encoded(rows("v", 4, "t", txn_id=txn), txn_id=txn)])
    )
    assert (body.count, body.txn_id) == (4, txn)
    commit = encoded([Message(MessageType.COMMIT_TXN, "v", txn_id=txn)], txn_id=txn)
    results(await wal.append_batches([commit]))
    await wal.close()
    assert [h.count for h in data_batches(await stored(backend))] == [1, 4, 1]


async def test_a_one_message_batch_on_the_per_message_path_keeps_its_dedup_key() -> None:
    backend = MemoryBackend()
    wal = await open_wal(backend)
    ddl = encoded([Message(MessageType.DROP_PARTITION, "v")], producer_id=4, sequence=1)
    (first,) = results(await wal.append_batches([ddl]))
    (again,) = results(await wal.append_batches([ddl]))
    assert again == first
    await wal.close()
    (header,) = data_batches(await stored(backend))
    assert (header.producer_id, header.sequence) == (4, 1), "stored with its key for a rebuild"


async def test_batches_and_single_messages_interleaved_keep_timeticks_increasing() -> None:
    backend = MemoryBackend()
    wal = await open_wal(backend)

    async def batches(tag: str) -> list[BatchAppendResult]:
        out: list[BatchAppendResult] = []
        for i in range(20):
            out += results(await wal.append_batches([encoded(rows("v", 1, f"{tag}{i}"))]))
        return out

    async def singles(tag: str) -> list[AppendResult]:
        out: list[AppendResult] = []
        for i in range(20):
            outcome = await wal.append_many(rows("w", 2, f"{tag}{i}"))
            assert all(isinstance(r, AppendResult) for r in outcome)
            out += [r for r in outcome if isinstance(r, AppendResult)]
        return out

    async with asyncio.timeout(WAIT):
        done = await asyncio.gather(batches("a"), singles("b"), batches("c"), singles("d"))
    await wal.close()
    records = await stored(backend)
    headers = [batch.read_header(r.data) for r in records]
    ticks = [h.base_timetick + i for h in headers for i in range(h.count)]
    assert all(a < b for a, b in itertools.pairwise(ticks)), ticks
    acknowledged = {r.timetick for rs in done for r in rs}
    assert len(acknowledged) == 20 * 2 + 20 * 2 * 2
    assert acknowledged <= set(ticks)


class _WritesThenFails(BackendWriter):
    """Stores the next append, then reports it failed (the outcome was unknown)."""

    def __init__(self, inner: BackendWriter) -> None:
        self.pchannel, self.term, self.inner = inner.pchannel, inner.term, inner
        self.fail_next = False

    async def append(self, records: Sequence[bytes]) -> list[MessageID]:
        ids = await self.inner.append(records)
        if self.fail_next:
            self.fail_next = False
            raise errors.Unavailable("connection lost after the write")
        return ids

    async def close(self) -> None:
        await self.inner.close()


class _FlakyBackend(DelegatingBackend):
    writer: _WritesThenFails | None = None

    async def open_writer(self, pchannel: str, term: int) -> BackendWriter:
        self.writer = _WritesThenFails(await self.inner.open_writer(pchannel, term))
        return self.writer


@pytest.mark.parametrize("size", [1, 4])
async def test_recovery_after_a_failed_append_reads_a_last_record_that_is_a_batch(
    size: int,
) -> None:
    """The append reached the log but was reported failed: the WAL finds the
    batch as the backend's last record, its last message's id and timetick."""
    backend = _FlakyBackend()
    wal = await open_wal(backend)
    assert backend.writer is not None
    backend.writer.fail_next = True
    (lost,) = await wal.append_batches([encoded(rows("v", size, "maybe"))])
    assert isinstance(lost, errors.Unavailable)
    last = await backend.last_record("p")
    assert last is not None
    header = batch.read_header(last.data)
    expected = message_id(last.id, size - 1)
    for _ in range(1000):  # the recovery runs in the background
        if wal.last_id == expected:
            break
        await asyncio.sleep(0.01)
    assert wal.last_id == expected
    assert wal.last_timetick == header.last_timetick
    (after,) = results(await wal.append_batches([encoded(rows("v", 1, "after"))]))
    assert after.timetick > header.last_timetick
    await wal.close()


async def test_a_message_first_sent_in_format_1_is_deduplicated_after_the_switch() -> None:
    """Term 1 wrote format 1 (a message with its per-message dedup properties,
    whose answer the producer never got); term 2 writes format 2: the retry,
    a batch of that one message without a producer id, gets the first result."""
    backend = MemoryBackend()
    first = await open_wal(backend, options=WALOptions(timetick_interval_ms=3_600_000))
    keyed = Message(MessageType.INSERT, "v", b"once", {"producer_id": "p1", "producer_seq": "4"})
    original = await first.append(keyed)
    await first.close()
    second = await open_wal(backend, term=2)
    retried = batch.encode([keyed], BatchInfo("v"))
    (again,) = results(await second.append_batches([retried]))
    assert again == BatchAppendResult.of(original, 1)
    several = batch.encode([keyed, keyed], BatchInfo("v"))
    (refused,) = await second.append_batches([several])
    assert isinstance(refused, errors.InvalidArgument), "such a message goes alone"
    await second.close()
    payloads = [r.data for r in await stored(backend) if b"once" in r.data]
    assert len(payloads) == 1


@pytest.mark.parametrize("kind", ["memory", "local"])
async def test_a_reopen_after_batches_of_several_messages_reads_from_a_record(
    kind: str, tmp_path: Path
) -> None:
    """The anchors the WAL's ticks carry name records (index 0), which is what a
    backend reads from: also when the last message was inside a batch."""
    backend = backend_of(kind, tmp_path)
    first = await open_wal(backend)
    results(await first.append_batches([encoded(rows("v", 4, "free"))]))
    assert first.last_id is not None and first.last_id.index == 3
    await first.close()  # its last tick names where a rebuild starts: the batch's record
    last = await backend.last_record("p")
    assert last is not None
    (tick,) = batch.messages(last.data)
    anchored = [r for r in await stored(backend) if str(r.id) == tick.properties["dedup_from"]]
    assert [batch.read_header(r.data).count for r in anchored] == [4]
    first = await open_wal(backend, term=2)
    key = encoded(rows("v", 3, "keyed"), producer_id=8, sequence=1)
    (acked,) = results(await first.append_batches([key]))
    results(await first.append_batches([encoded(rows("v", 5, "after"))]))
    await first.close()
    second = await open_wal(backend, term=3)
    (again,) = results(await second.append_batches([key]))
    assert again == acked
    await second.close()
    third = await open_wal(backend, term=4)
    (still,) = results(await third.append_batches([key]))
    assert still == acked
    await third.close()
