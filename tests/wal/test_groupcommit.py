"""Group commit of the broker writers, with a fake blocking write (no broker)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Sequence

import pytest

from headrace import errors
from headrace.message.ids import MessageID
from headrace.wal.groupcommit import GroupCommit, take_group
from headrace.wal.iothread import IOThread, call_in, call_job
from headrace.wal.kafka.message_id import KafkaMessageID

pytestmark = pytest.mark.timeout(30)


class FakeLog:
    """A blocking write that hands out offsets; can be held or made to fail."""

    def __init__(self) -> None:
        self.writes: list[list[bytes]] = []
        self.next_offset = 0
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_with: BaseException | None = None

    def write(self, records: list[bytes]) -> Sequence[MessageID]:
        self.entered.set()
        assert self.gate.wait(10)
        if self.fail_with is not None:
            raise self.fail_with
        self.writes.append(list(records))
        first = self.next_offset
        self.next_offset += len(records)
        return [KafkaMessageID(first + i) for i in range(len(records))]


Thread = IOThread[Callable[[], None]]


@pytest.fixture
async def thread() -> AsyncIterator[Thread]:
    running: Thread = IOThread("test-writer", call_job)
    yield running
    running.stop()


def _offsets(ids: Sequence[MessageID]) -> list[int]:
    return [mid.offset for mid in ids if isinstance(mid, KafkaMessageID)]


async def _entered(log: FakeLog) -> None:
    assert await asyncio.to_thread(log.entered.wait, 10)


async def test_calls_during_a_write_share_the_next_one(
    thread: Thread,
) -> None:
    log = FakeLog()
    group = GroupCommit(log.write, thread)
    log.gate.clear()
    first = group.start([b"a"])
    await _entered(log)  # the first call's write started without waiting for a task
    seen: list[list[int]] = []
    later = [
        group.start([b"b", b"c"], lambda f: seen.append(_offsets(f.result()))),
        group.start([b"d"], lambda f: seen.append(_offsets(f.result()))),
    ]
    log.gate.set()
    assert _offsets(await first) == [0]
    assert [_offsets(await f) for f in later] == [[1, 2], [3]]
    assert log.writes == [[b"a"], [b"b", b"c", b"d"]]
    assert seen == [[1, 2], [3]]
    await group.drain()


async def test_bounds_split_the_queue_but_never_a_call() -> None:
    assert take_group([(5, 50), (5, 50), (5, 50)], max_records=10, max_bytes=1000) == 2
    assert take_group([(5, 50), (5, 50)], max_records=100, max_bytes=60) == 1
    assert take_group([(50, 5000), (1, 1)], max_records=10, max_bytes=10) == 1
    assert take_group([], max_records=10, max_bytes=10) == 0


async def test_a_fenced_write_fails_what_is_queued_and_everything_after(
    thread: Thread,
) -> None:
    log = FakeLog()
    group = GroupCommit(log.write, thread)
    log.gate.clear()
    log.fail_with = errors.Fenced("a newer term took over", term=1, current_term=2)
    in_flight = group.start([b"x"])
    await _entered(log)
    queued = group.start([b"y"])
    log.gate.set()
    for future in (in_flight, queued):
        with pytest.raises(errors.Fenced):
            await future
    log.fail_with = None
    with pytest.raises(errors.Fenced):
        await group.submit([b"z"])
    assert log.writes == [], "nothing was written after the fence"
    await group.drain()


async def test_an_unexpected_exception_still_answers_every_caller(
    thread: Thread,
) -> None:
    log = FakeLog()
    log.fail_with = ValueError("a bug in the client")
    group = GroupCommit(log.write, thread, what="test append")
    with pytest.raises(errors.HeadraceError, match="test append failed unexpectedly"):
        await group.submit([b"x"])
    log.fail_with = None
    assert _offsets(await group.submit([b"y"])) == [0], "the writer goes on after a failure"


async def test_an_empty_call_and_a_stopped_thread() -> None:
    thread: Thread = IOThread("test-writer", call_job)
    log = FakeLog()
    group = GroupCommit(log.write, thread)
    assert await group.submit([]) == []
    thread.stop()
    with pytest.raises(errors.Closed):
        await group.submit([b"x"])
    await group.drain()


# ---- the writer's thread -------------------------------------------------------------------


async def test_calls_in_the_thread_run_in_order_and_answer_with_their_outcome(
    thread: Thread,
) -> None:
    ran: list[str] = []
    gate = threading.Event()

    def first() -> str:
        assert gate.wait(10)
        ran.append(threading.current_thread().name)
        return "first"

    def second() -> None:
        ran.append("second")
        raise ValueError("the client broke")

    one = asyncio.ensure_future(call_in(thread, "test call", first))
    two = asyncio.ensure_future(call_in(thread, "test call", second))
    await asyncio.sleep(0)
    gate.set()
    assert await one == "first"
    with pytest.raises(ValueError, match="the client broke"):
        await two
    assert ran == ["test-writer", "second"], "one thread, in submission order"


async def test_a_stopped_thread_refuses_calls_but_finishes_those_submitted_before() -> None:
    thread: Thread = IOThread("test-writer", call_job)
    gate = threading.Event()
    done: list[int] = []

    def slow() -> int:
        assert gate.wait(10)
        done.append(1)
        return 1

    pending = asyncio.ensure_future(call_in(thread, "test call", slow))
    await asyncio.sleep(0)
    thread.stop()
    assert thread.stopped
    with pytest.raises(errors.Closed, match="test call"):
        await call_in(thread, "test call", lambda: 2)
    gate.set()
    assert await pending == 1
    assert done == [1]
