"""Consumers follow their pchannel to a new owner on real node processes.

A paused owner (SIGSTOP past its lease) answers nothing and ends nothing: its
Consume stream just hangs. A consumer must leave it once a newer term is
ASSIGNED, as producers do, and resume at the new owner from its last
delivered position, while the old owner is still stopped; after the old
owner resumes, nothing may be delivered twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from headrace.bench import handoff
from headrace.bench.procs import ClusterSpec, NodeProc, ProcCluster
from headrace.client import Consumer, HeadraceClient, ProducerOptions
from headrace.client.arguments import Start
from headrace.cluster import Assignment, AssignmentState
from headrace.coordinator.snapshot import ClusterSnapshot, wait_for
from headrace.message.ids import MessageID
from headrace.wal.api import AppendResult

HANG_GUARD = 30.0
"""Seconds after which a wait is a hang, not slowness."""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


class Sender:
    """Appends 1, 2, 3, ... to one vchannel, one at a time; records each acknowledgement."""

    def __init__(self, client: HeadraceClient, vchannel: str) -> None:
        self.client = client
        self.vchannel = vchannel
        self.acked: list[tuple[int, AppendResult]] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sender")

    async def stop(self) -> None:
        """Let the send in flight finish (a cancelled one may be written
        unacknowledged), then stop."""
        self._stop.set()
        if self._task is not None:
            async with asyncio.timeout(HANG_GUARD):
                await self._task

    async def abort(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        # A deadline past every wait of the test: a send never fails, so the
        # acknowledged numbers are exactly 1..n.
        async with self.client.producer(ProducerOptions(deadline=10 * HANG_GUARD)) as producer:
            number = 0
            while not self._stop.is_set():
                number += 1
                result = await producer.send(self.vchannel, str(number).encode())
                self.acked.append((number, result))
                await asyncio.sleep(0.005)

    def first_term_above(self, term: int) -> int | None:
        return next((n for n, r in self.acked if r.term > term), None)


class Reader:
    """Collects every message a consumer delivers: (number, id, term)."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.got: list[tuple[int, MessageID, int]] = []
        self._task = asyncio.create_task(self._run(), name="reader")

    async def _run(self) -> None:
        async for entry in self.consumer:
            self.got.append((int(entry.message.payload), entry.id, entry.message.term))

    def done(self) -> str:
        """How the reading task ended, if it did."""
        if not self._task.done():
            return ""
        return "cancelled" if self._task.cancelled() else repr(self._task.exception())

    def numbers(self) -> list[int]:
        return [n for n, _, _ in self.got]

    def has_term_above(self, term: int) -> bool:
        return any(t > term for _, _, t in self.got)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.consumer.close()


async def until(condition: Callable[[], bool], what: str | Callable[[], str]) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after HANG_GUARD."""
    try:
        async with asyncio.timeout(HANG_GUARD):
            while True:
                if condition():
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        said = what if isinstance(what, str) else what()
        raise AssertionError(f"waited {HANG_GUARD:g}s for {said}") from None


async def caught_up(reader: Reader, sender: Sender) -> None:
    """Wait until the reader delivered the last acknowledged number."""
    last = sender.acked[-1][0]

    def state() -> str:
        numbers = reader.numbers()
        missing = sorted(set(range(numbers[0] if numbers else 1, last + 1)) - set(numbers))
        return (
            f"catch-up to {last}: got {len(numbers)}, last {numbers[-3:]}, "
            f"missing {missing[:10]}, owner {reader.consumer.owner}, "
            f"reconnects {reader.consumer.reconnects}, reader done {reader.done()}"
        )

    await until(lambda: reader.numbers()[-1:] == [last], state)


@contextlib.asynccontextmanager
async def one_pchannel_cluster(tmp_path: Path) -> AsyncIterator[tuple[ProcCluster, str, str]]:
    """Two node processes, one pchannel, no balancing; yields (procs, pchannel, vchannel)."""
    spec = ClusterSpec(root=tmp_path, nodes=2, pchannels=1, lease_ttl_s=1.5)
    (pchannel,) = spec.pchannel_names
    async with ProcCluster(spec) as procs:
        await procs.admin.suspend_balance(True)
        yield procs, pchannel, handoff.probe_vchannel(pchannel, spec.pchannel_names)


@dataclasses.dataclass
class Traffic:
    """A :class:`Sender` on the one vchannel of a two-node cluster, and the readers opened on it."""

    procs: ProcCluster
    pchannel: str
    vchannel: str
    client: HeadraceClient
    sender: Sender
    readers: list[Reader] = dataclasses.field(default_factory=list)

    def read(self, start: Start) -> Reader:
        reader = Reader(self.client.consume(self.vchannel, start=start))
        self.readers.append(reader)
        return reader

    async def tail(self) -> tuple[Reader, int]:
        """A consumer from the latest message once it delivered ten, and its first number."""
        reader = self.read("latest")
        await until(lambda: len(reader.got) >= 10, "the tail consumer to deliver")
        return reader, reader.got[0][0]


@contextlib.asynccontextmanager
async def traffic(tmp_path: Path, first_acks: int) -> AsyncIterator[Traffic]:
    """:func:`one_pchannel_cluster` with a sender running, once ``first_acks``
    sends were acknowledged; the sender and readers are stopped on exit."""
    async with (
        one_pchannel_cluster(tmp_path) as (procs, pchannel, vchannel),
        HeadraceClient(procs.spec.metastore_url, procs.spec.cluster) as client,
    ):
        sender = Sender(client, vchannel)
        sender.start()
        run = Traffic(procs, pchannel, vchannel, client, sender)
        try:
            await until(lambda: len(sender.acked) >= first_acks, "first acknowledgements")
            yield run
        finally:
            await sender.abort()
            for reader in run.readers:
                await reader.close()


async def owner_record(procs: ProcCluster, pchannel: str) -> tuple[Assignment, NodeProc]:
    record = (await procs.snapshot()).assignments[pchannel]
    return record, procs.nodes[record.node]


def assert_exactly_once(reader: Reader, sender: Sender, first: int) -> None:
    """The reader got ``first``..last acknowledged number, each once, in order."""
    numbers = reader.numbers()
    last = sender.acked[-1][0]
    assert numbers[: last - first + 1] == list(range(first, last + 1)), numbers
    ids = [mid for _, mid, _ in reader.got]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


async def test_tail_consumer_leaves_a_paused_owner_for_the_new_one(tmp_path: Path) -> None:
    async with traffic(tmp_path, first_acks=5) as run:
        procs, pchannel, sender = run.procs, run.pchannel, run.sender
        reader, first = await run.tail()
        old, owner = await owner_record(procs, pchannel)
        owner.pause()
        await until(lambda: sender.first_term_above(old.term) is not None, "producer move")
        # The consumer must get what the new owner acknowledged while the
        # old one is still stopped.
        await until(lambda: reader.has_term_above(old.term), "the consumer to move")
        assert owner.paused, "the old owner was resumed before the consumer moved on"
        new, _ = await owner_record(procs, pchannel)
        assert new.node != old.node and new.term > old.term
        assert reader.consumer.owner is not None
        assert reader.consumer.owner.term == new.term
        owner.resume()
        more = len(sender.acked) + 20
        await until(lambda: len(sender.acked) >= more, "sends after the old owner resumed")
        await sender.stop()
        await caught_up(reader, sender)
        assert_exactly_once(reader, sender, first)


async def test_consumer_started_on_a_paused_owner_finds_the_new_one(tmp_path: Path) -> None:
    async with traffic(tmp_path, first_acks=20) as run:
        old, owner = await owner_record(run.procs, run.pchannel)
        owner.pause()
        # Opened while the stopped node is still the recorded owner.
        reader = run.read("earliest")
        await until(lambda: reader.has_term_above(old.term), "the consumer to move")
        assert owner.paused, "the old owner was resumed before the consumer moved on"
        owner.resume()
        await run.sender.stop()
        await caught_up(reader, run.sender)
        assert_exactly_once(reader, run.sender, 1)


async def test_tail_consumer_follows_a_graceful_move(tmp_path: Path) -> None:
    async with traffic(tmp_path, first_acks=5) as run:
        procs, pchannel, sender = run.procs, run.pchannel, run.sender
        reader, first = await run.tail()
        old, _ = await owner_record(procs, pchannel)
        target = next(n for n in procs.nodes if n != old.node)
        await procs.admin.request_move(pchannel, target)

        def landed(snap: ClusterSnapshot) -> bool:
            record = snap.assignments.get(pchannel)
            return (
                record is not None
                and record.node == target
                and record.term > old.term
                and record.state is AssignmentState.ASSIGNED
            )

        await wait_for(procs.metastore, procs.spec.cluster, landed, HANG_GUARD)
        await until(lambda: reader.has_term_above(old.term), "the consumer to move")
        await sender.stop()
        await caught_up(reader, sender)
        assert_exactly_once(reader, sender, first)
        assert reader.consumer.owner is not None and reader.consumer.owner.node == target
