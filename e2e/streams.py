"""The Headrace side of the scenarios, through the client library and the
metastore only.

* :class:`AssignmentHistory`: every assignment record the cluster's metastore
  goes through, from a watch (the coordination protocol's own audit trail).
* :func:`produce`, :func:`seal`, :func:`consume`: numbered traffic through
  :class:`headrace.client.HeadraceClient`; :func:`delivery_problems` checks it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from typing import Any

from headrace.client import HeadraceClient, ProducerOptions
from headrace.cluster import Assignment, AssignmentState, Keys
from headrace.message.types import Message, MessageType
from headrace.metastore.contract import EventType, Metastore
from headrace.metastore.factory import open_metastore
from headrace.wal.api import AppendResult

HOLDING = (AssignmentState.ASSIGNING, AssignmentState.ASSIGNED, AssignmentState.UNASSIGNING)


class AssignmentHistory:
    """Every assignment record of a cluster since :meth:`start`, in revision order."""

    def __init__(self, metastore_url: str, cluster: str) -> None:
        self.url = metastore_url
        self.keys = Keys(cluster)
        self.records: list[tuple[int, Assignment]] = []
        self._store: Metastore | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> AssignmentHistory:
        self._store = await open_metastore(self.url)
        revision = await self._store.revision()
        for kv in await self._store.get_prefix(self.keys.pchannels):
            self.records.append((kv.mod_revision, Assignment.from_json(kv.value)))
        watch = await self._store.watch_prefix(self.keys.pchannels, start_revision=revision + 1)
        self._task = asyncio.create_task(self._follow(watch))
        return self

    async def _follow(self, watch: Any) -> None:
        try:
            async for event in watch:
                if event.type is EventType.PUT:
                    record = Assignment.from_json(event.kv.value)
                    self.records.append((event.kv.mod_revision, record))
        finally:
            await watch.close()

    async def current(self) -> dict[str, Assignment]:
        """The records as the metastore holds them now (a fresh read)."""
        assert self._store is not None
        kvs = await self._store.get_prefix(self.keys.pchannels)
        return {a.pchannel: a for a in (Assignment.from_json(kv.value) for kv in kvs)}

    def by_pchannel(self) -> dict[str, list[Assignment]]:
        out: dict[str, list[Assignment]] = {}
        for _revision, record in sorted(self.records, key=lambda item: item[0]):
            out.setdefault(record.pchannel, []).append(record)
        return out

    def taken_away(self, node: str) -> list[str]:
        """Records that took a pchannel from ``node`` while it still held it
        (a failover: the node never wrote UNASSIGNED); empty after clean drains."""
        found = []
        for pchannel, records in self.by_pchannel().items():
            for before, after in itertools.pairwise(records):
                if before.node == node and before.state in HOLDING and after.node != node:
                    found.append(
                        f"{pchannel}: {before.state.value}({node}, term {before.term}) -> "
                        f"{after.state.value}({after.node}, term {after.term})"
                    )
        return found

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._store is not None:
            await self._store.close()


@dataclasses.dataclass
class Traffic:
    """What a producer sent and what was acknowledged, per vchannel."""

    acked: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    failed: list[str] = dataclasses.field(default_factory=list)
    sent: int = 0

    @property
    def acked_total(self) -> int:
        return sum(len(v) for v in self.acked.values())


END = -1
"""The number of the marker message :func:`seal` writes last on a vchannel."""


async def produce(
    client: HeadraceClient,
    vchannels: list[str],
    traffic: Traffic,
    *,
    count: int | None = None,
    stop: asyncio.Event | None = None,
    batch: int = 64,
    deadline: float = 60.0,
) -> Traffic:
    """Send numbered messages round-robin over ``vchannels`` (payload
    ``<vchannel>:<n>``) until ``count`` were sent or ``stop`` is set; each
    message is retried for up to ``deadline`` seconds."""
    options = ProducerOptions(max_batch_messages=batch, deadline=deadline)
    async with client.producer(options) as producer:
        while (count is None or traffic.sent < count) and not (stop and stop.is_set()):
            size = batch if count is None else min(batch, count - traffic.sent)
            numbered = [
                (vchannels[(traffic.sent + i) % len(vchannels)], traffic.sent + i)
                for i in range(size)
            ]
            traffic.sent += size
            messages = [Message(MessageType.INSERT, v, f"{v}:{n}".encode()) for v, n in numbered]
            outcomes = await producer.send_many(messages)
            for (vchannel, number), outcome in zip(numbered, outcomes, strict=True):
                if isinstance(outcome, AppendResult):
                    traffic.acked.setdefault(vchannel, []).append(number)
                else:
                    traffic.failed.append(f"{vchannel}:{number}: {outcome}")
    return traffic


async def seal(client: HeadraceClient, vchannels: list[str]) -> None:
    """Write the end marker on each vchannel, after everything produced before."""
    async with client.producer(ProducerOptions(deadline=60.0)) as producer:
        for vchannel in vchannels:
            await producer.send(vchannel, f"{vchannel}:{END}".encode())


async def consume(client: HeadraceClient, vchannel: str, limit: float = 60.0) -> list[int]:
    """The numbers read from ``vchannel`` from its earliest message up to the
    end marker of :func:`seal` (AssertionError if it is not reached in ``limit``)."""
    numbers: list[int] = []
    consumer = client.consume(vchannel, "earliest")
    try:
        async with asyncio.timeout(limit):
            async for entry in consumer:
                name, _, number = entry.message.payload.decode().partition(":")
                assert name == vchannel, f"{vchannel} delivered a message of {name}"
                if int(number) == END:
                    return numbers
                numbers.append(int(number))
    except TimeoutError:
        raise AssertionError(
            f"{vchannel}: no end marker within {limit:g}s after {len(numbers)} message(s)"
        ) from None
    finally:
        await consumer.close()
    raise AssertionError(f"{vchannel}: the consumer ended before the end marker")


def delivery_problems(vchannel: str, acked: list[int], consumed: list[int]) -> list[str]:
    """Why ``consumed`` is not every acknowledged message once, in order (empty if it is)."""
    problems = []
    duplicates = len(consumed) - len(set(consumed))
    if duplicates:
        problems.append(f"{vchannel}: {duplicates} message(s) delivered twice")
    acked_set = set(acked)
    missing = acked_set - set(consumed)
    if missing:
        problems.append(
            f"{vchannel}: {len(missing)} of {len(acked)} acknowledged message(s) never "
            f"delivered (first {sorted(missing)[:5]})"
        )
    in_order = [n for n in consumed if n in acked_set]
    if not missing and not duplicates and in_order != acked:
        problems.append(f"{vchannel}: delivered out of order")
    return problems
