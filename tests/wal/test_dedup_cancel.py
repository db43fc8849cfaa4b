"""Dedup when the appending caller goes away: the write goes on, so must the bookkeeping.

A node's Produce handler is cancelled when its client gives up on the stream
(its deadline passed while the broker stalled); the appender still writes the
batch. The dedup window must learn the outcome of that write, or the client's
retry of the same (producer, seq) is written a second time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from headrace import errors
from headrace.message import codec
from headrace.message.ids import MessageID
from headrace.message.types import Message, MessageType
from headrace.tso import LocalTSO
from headrace.wal.api import AppendResult
from headrace.wal.contract import BackendWriter
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.interceptors.chain import AppendContext, Handler
from headrace.wal.interceptors.dedup import DedupInterceptor, DedupWindow
from headrace.wal.memory import MemoryMessageID as MID
from tests.wal.delegating import DelegatingBackend, payload_copies

QUIET = WALOptions(timetick_interval_ms=3_600_000)


def produced(payload: bytes, producer: str, seq: int) -> Message:
    return Message(
        MessageType.INSERT, "v", payload, {"producer_id": producer, "producer_seq": str(seq)}
    )


class GatedWriter(BackendWriter):
    """Holds every data append until ``gate`` is set (a stalled broker)."""

    def __init__(self, inner: BackendWriter, gate: asyncio.Event) -> None:
        self.inner = inner
        self.gate = gate
        self.pchannel = inner.pchannel
        self.term = inner.term

    async def append(self, records: Sequence[bytes]) -> list[MessageID]:
        if any(codec.decode(r).payload for r in records):
            await self.gate.wait()
        return await self.inner.append(records)

    async def close(self) -> None:
        await self.inner.close()


class GatedBackend(DelegatingBackend):
    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()

    async def open_writer(self, pchannel: str, term: int) -> BackendWriter:
        return GatedWriter(await self.inner.open_writer(pchannel, term), self.gate)


async def call_then_leave(
    interceptor: DedupInterceptor, write: Handler, msg: Message, gate: asyncio.Event
) -> None:
    """Send ``msg`` through ``interceptor``, cancel the caller while ``write``
    waits on ``gate``, then open the gate and let the write finish."""
    caller = asyncio.create_task(interceptor([AppendContext(msg, 0)], write))
    await asyncio.sleep(0)
    caller.cancel()
    await asyncio.gather(caller, return_exceptions=True)
    gate.set()
    await asyncio.sleep(0.01)


async def wal_with_an_abandoned_write() -> tuple[GatedBackend, WAL]:
    """A WAL on a closed gate whose append of ``x`` (prod, 1) was cancelled
    while held at the gate: the client gave up on its stream, the appender
    still writes once the gate opens."""
    backend = GatedBackend()
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    backend.gate.clear()
    first = asyncio.create_task(wal.append_many([produced(b"x", "prod", 1)]))
    await asyncio.sleep(0.05)
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    return backend, wal


async def test_a_retry_after_the_caller_was_cancelled_mid_write_is_not_written_again() -> None:
    backend, wal = await wal_with_an_abandoned_write()
    backend.gate.set()
    retried = await asyncio.wait_for(wal.append(produced(b"x", "prod", 1)), 10)
    assert retried.term == 1
    assert await payload_copies(backend, b"x") == 1, "the retry was written a second time"
    again = await wal.append(produced(b"x", "prod", 1))
    assert again == retried
    await wal.close()


async def test_a_retry_during_the_cancelled_callers_write_waits_for_its_outcome() -> None:
    backend, wal = await wal_with_an_abandoned_write()
    retry = asyncio.create_task(wal.append(produced(b"x", "prod", 1)))
    await asyncio.sleep(0.05)
    assert not retry.done(), "the retry must wait for the write still in flight"
    backend.gate.set()
    result = await asyncio.wait_for(retry, 10)
    assert await payload_copies(backend, b"x") == 1
    assert await wal.append(produced(b"x", "prod", 1)) == result
    await wal.close()


async def test_the_interceptor_remembers_a_write_that_ends_after_its_caller_left() -> None:
    interceptor = DedupInterceptor(DedupWindow(10))
    gate = asyncio.Event()
    written: list[int] = []

    async def write(batch: list[AppendContext]) -> None:
        await gate.wait()
        for i, c in enumerate(batch):
            written.append(i)
            c.result = AppendResult(MID(i), 10 + i, 1)

    msg = produced(b"x", "p", 7)
    await call_then_leave(interceptor, write, msg, gate)
    assert interceptor.window.get(("p", 7)) == AppendResult(MID(0), 10, 1)
    repeat = AppendContext(msg, 0)
    await interceptor([repeat], write)
    assert repeat.result == AppendResult(MID(0), 10, 1) and written == [0]


async def test_a_failed_write_after_its_caller_left_is_forgotten() -> None:
    interceptor = DedupInterceptor(DedupWindow(10))
    gate = asyncio.Event()

    async def write(batch: list[AppendContext]) -> None:
        await gate.wait()
        for c in batch:
            c.fail(errors.Unavailable("disk went away"))

    msg = produced(b"x", "p", 7)
    await call_then_leave(interceptor, write, msg, gate)
    assert interceptor.window.get(("p", 7)) is None
    assert not interceptor._inflight


async def test_a_cancelled_waiter_does_not_cancel_the_others() -> None:
    """Repeats of a key being written share one wait: one of them going away
    must neither cancel the others nor break the writer's bookkeeping."""
    interceptor = DedupInterceptor(DedupWindow(10))
    gate = asyncio.Event()
    loop_errors: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: loop_errors.append(ctx))

    async def write(batch: list[AppendContext]) -> None:
        await gate.wait()
        for c in batch:
            c.result = AppendResult(MID(0), 10, 1)

    msg = produced(b"x", "p", 7)
    writer = asyncio.create_task(interceptor([AppendContext(msg, 0)], write))
    await asyncio.sleep(0)
    leaving, staying = AppendContext(msg, 0), AppendContext(msg, 0)
    left = asyncio.create_task(interceptor([leaving], write))
    stays = asyncio.create_task(interceptor([staying], write))
    await asyncio.sleep(0)
    left.cancel()
    await asyncio.gather(left, return_exceptions=True)
    gate.set()
    await asyncio.wait_for(asyncio.gather(writer, stays), 10)
    assert staying.result == AppendResult(MID(0), 10, 1)
    assert loop_errors == []
