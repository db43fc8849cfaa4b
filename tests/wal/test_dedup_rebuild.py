"""Rebuilding the dedup window on open: a bounded read, complete or failed.

After a crash the last record may be data (no tick or fence naming where the
window starts): the rebuild must still read only the log's tail, not the whole
log. A read that stalls before reaching the last record must fail the open
(retryably), never leave the WAL serving with a partial window.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from headrace import errors
from headrace.message.types import Message, MessageType
from headrace.tso import LocalTSO
from headrace.wal import registry
from headrace.wal.api import WALState
from headrace.wal.contract import Backend, Record
from headrace.wal.framework import DEFAULT_OPEN_TIMEOUT_S, WAL, WALOptions, open_timeout
from headrace.wal.kafka.message_id import KafkaMessageID
from headrace.wal.local.message_id import LocalMessageID
from headrace.wal.memory.message_id import MemoryMessageID
from headrace.wal.pulsar.message_id import PulsarMessageID
from headrace.wal.rebuild import probe_start
from tests.wal.delegating import CountingBackend, DelegatingBackend, payload_copies

QUIET = WALOptions(timetick_interval_ms=3_600_000)
LONG_LOG = 20_000


def produced(payload: bytes, producer: str, seq: int) -> Message:
    return Message(
        MessageType.INSERT, "v", payload, {"producer_id": producer, "producer_seq": str(seq)}
    )


def filler(i: int) -> Message:
    return Message(MessageType.INSERT, "v", b"filler%d" % i)


async def append_all(wal: WAL, msgs: list[Message]) -> None:
    for i in range(0, len(msgs), 1000):
        for result in await wal.append_many(msgs[i : i + 1000]):
            assert not isinstance(result, errors.HeadraceError), result


def make_backend(kind: str, tmp_path: Path) -> Backend:
    if kind == "local":
        return registry.create("local", root=str(tmp_path))
    return registry.create("memory")


@pytest.mark.parametrize("kind", ["memory", "local"])
async def test_reopen_after_a_crash_reads_from_the_last_tick_not_the_log_start(
    kind: str, tmp_path: Path
) -> None:
    """Term 1 wrote a long log and handed off; term 2 wrote a keyed message and
    crashed (its last record is data). Term 3 reads back to term 2's fence only."""
    backend = make_backend(kind, tmp_path)
    wal1 = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    await append_all(wal1, [filler(i) for i in range(LONG_LOG)])
    await wal1.close()
    wal2 = await WAL.open(backend, "p", 2, tso=LocalTSO(), options=QUIET)
    original = await wal2.append(produced(b"x", "prod", 1))
    await append_all(wal2, [filler(i) for i in range(50)])
    counting = CountingBackend(backend)
    wal3 = await WAL.open(counting, "p", 3, tso=LocalTSO(), options=QUIET)
    assert counting.fetched < 1_000, f"the rebuild read {counting.fetched} records"
    assert await wal3.append(produced(b"x", "prod", 1)) == original
    assert await payload_copies(backend, b"x") == 1
    await wal3.close()
    await wal2.close()
    await backend.close()


@pytest.mark.parametrize("kind", ["memory", "local"])
async def test_reopen_after_a_crash_without_a_tick_in_reach_reads_one_window(
    kind: str, tmp_path: Path
) -> None:
    """Every record keyed, no tick but the first fence: the rebuild stops once
    it read as many keyed records as the window holds."""
    backend = make_backend(kind, tmp_path)
    options = WALOptions(timetick_interval_ms=3_600_000, dedup_window=100)
    wal1 = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=options)
    await append_all(wal1, [produced(b"m%d" % i, "prod", i) for i in range(LONG_LOG)])
    last = await wal1.append(produced(b"last", "prod", LONG_LOG))
    counting = CountingBackend(backend)
    wal2 = await WAL.open(counting, "p", 2, tso=LocalTSO(), options=options)
    assert counting.fetched < 1_000, f"the rebuild read {counting.fetched} records"
    assert await wal2.append(produced(b"last", "prod", LONG_LOG)) == last
    inside = await wal2.append(produced(b"m%d" % (LONG_LOG - 50), "prod", LONG_LOG - 50))
    assert inside.term == 1, "a pair inside the window was written again"
    assert await payload_copies(backend, b"last") == 1
    await wal2.close()
    await wal1.close()
    await backend.close()


async def test_a_probe_reaching_past_a_truncation_reads_what_is_left_once() -> None:
    backend = registry.create("memory")
    options = WALOptions(timetick_interval_ms=3_600_000, dedup_window=1_000)
    wal1 = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=options)
    await append_all(wal1, [produced(b"m%d" % i, "prod", i) for i in range(2_000)])
    last = await wal1.append(produced(b"last", "prod", 2_000))
    assert isinstance(last.id, MemoryMessageID)
    await backend.truncate("p", MemoryMessageID(last.id.seq - 100))
    counting = CountingBackend(backend)
    wal2 = await WAL.open(counting, "p", 2, tso=LocalTSO(), options=options)
    assert counting.fetched <= 101, f"the rebuild read {counting.fetched} records"
    assert await wal2.append(produced(b"last", "prod", 2_000)) == last
    await wal2.close()
    await wal1.close()


async def test_an_empty_log_with_a_lone_data_record_is_rebuilt() -> None:
    """Fewer records than a probe reaches back: read from the earliest."""
    backend = registry.create("memory")
    wal1 = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    original = await wal1.append(produced(b"x", "prod", 7))
    wal2 = await WAL.open(backend, "p", 2, tso=LocalTSO(), options=QUIET)
    assert await wal2.append(produced(b"x", "prod", 7)) == original
    await wal2.close()
    await wal1.close()


@pytest.mark.parametrize("graceful", [True, False])
async def test_a_stalled_rebuild_read_fails_the_open_and_a_retried_open_catches_the_retry(
    graceful: bool,
) -> None:
    """The backend's read times out (returns nothing) before the last record:
    the open fails retryably instead of serving with a partial window."""
    backend = registry.create("memory")
    wal1 = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    first = await wal1.append(produced(b"a", "prod", 1))
    await append_all(wal1, [filler(i) for i in range(10)])
    original = await wal1.append(produced(b"x", "prod", 2))
    await append_all(wal1, [filler(i) for i in range(2)])
    if graceful:
        await wal1.close()
    stalled = CountingBackend(backend, stall_after=5)
    with pytest.raises(errors.Unavailable) as failed:
        await WAL.open(stalled, "p", 2, tso=LocalTSO(), options=QUIET)
    assert failed.value.retryable
    assert "dedup" in str(failed.value)
    stalled.stall_after = None
    wal3 = await WAL.open(stalled, "p", 3, tso=LocalTSO(), options=QUIET)
    assert wal3.state is WALState.SERVING
    assert await wal3.append(produced(b"x", "prod", 2)) == original
    assert await wal3.append(produced(b"a", "prod", 1)) == first
    assert await payload_copies(backend, b"x") == 1
    await wal3.close()
    await wal1.close()


class HangingBackend(DelegatingBackend):
    """``last_record`` never answers (a backend stuck on a lock or a dead disk)."""

    async def last_record(self, pchannel: str) -> Record | None:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_an_open_that_cannot_finish_in_its_bound_fails_retryably() -> None:
    backend = HangingBackend()
    options = WALOptions(timetick_interval_ms=3_600_000, open_timeout_s=0.2)
    with pytest.raises(errors.Unavailable) as failed:
        await asyncio.wait_for(WAL.open(backend, "p", 1, tso=LocalTSO(), options=options), 30)
    assert failed.value.retryable
    assert "0.2" in str(failed.value)
    await backend.close()


def test_the_open_bound_must_be_positive() -> None:
    with pytest.raises(errors.InvalidArgument, match="open_timeout_s"):
        WALOptions(open_timeout_s=0)


def test_the_open_bound_follows_the_backend_unless_given() -> None:
    assert open_timeout(WALOptions(), {"backend": "local"}) == DEFAULT_OPEN_TIMEOUT_S
    assert open_timeout(WALOptions(), {"operation_timeout_s": 30.0}) == 120.0
    assert open_timeout(WALOptions(), {"operation_timeout_s": True}) == DEFAULT_OPEN_TIMEOUT_S
    assert open_timeout(WALOptions(open_timeout_s=2.5), {"operation_timeout_s": 30.0}) == 2.5


def test_ids_name_a_bounded_start_before_them() -> None:
    assert MemoryMessageID(1000).preceding(256) == MemoryMessageID(744)
    assert MemoryMessageID(100).preceding(256) is None
    assert LocalMessageID(256).preceding(256) == LocalMessageID(0)
    assert KafkaMessageID(10).preceding(11) is None
    assert KafkaMessageID(5000).preceding(1024) == KafkaMessageID(3976)
    # Pulsar ledger ids are not consecutive: a probe stops at its ledger's start.
    assert PulsarMessageID(7, 300).preceding(256) == PulsarMessageID(7, 44)
    assert PulsarMessageID(7, 30).preceding(256) == PulsarMessageID(7, 0)
    assert PulsarMessageID(7, 0).preceding(256) is None


def test_a_probe_that_cannot_reach_further_starts_at_the_earliest() -> None:
    last = PulsarMessageID(7, 30)
    assert probe_start(last, 256, None) == PulsarMessageID(7, 0)
    assert probe_start(last, 1024, PulsarMessageID(7, 0)) is None
    assert probe_start(MemoryMessageID(5000), 1024, MemoryMessageID(4744)) == MemoryMessageID(3976)
