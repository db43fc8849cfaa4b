"""The lock interceptor's groups: a batch over many vchannels admitted as one,
with DDL still ordered exactly as by per-vchannel locks."""

from __future__ import annotations

import asyncio

from headrace.message.types import Message, MessageType
from headrace.wal.interceptors.chain import AppendContext
from headrace.wal.interceptors.lock import LockInterceptor

WAIT = 10.0


def ctx(kind: MessageType, vchannel: str) -> AppendContext:
    return AppendContext(Message(kind, vchannel, b""), 0)


class Gate:
    """The chain's inner handler: records the order batches reach it, holds
    the batches whose first vchannel is in ``held`` until released."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.held: dict[str, asyncio.Event] = {}

    def hold(self, vchannel: str) -> asyncio.Event:
        event = self.held[vchannel] = asyncio.Event()
        return event

    async def __call__(self, batch: list[AppendContext]) -> None:
        first = batch[0].message
        self.order.append(f"{first.type.name}:{first.vchannel}")
        event = self.held.get(first.vchannel)
        if event is not None and first.type is MessageType.INSERT:
            await event.wait()


async def test_a_batch_over_many_vchannels_holds_them_all_without_a_lock_each() -> None:
    lock, gate = LockInterceptor(), Gate()
    release = gate.hold("v0")
    wide = [ctx(MessageType.INSERT, f"v{i}") for i in range(1000)]
    task = asyncio.create_task(lock(wide, gate))
    await asyncio.sleep(0)
    assert lock.held("v0") and lock.held("v999") and not lock.held("w")
    release.set()
    await asyncio.wait_for(task, WAIT)
    assert not lock.held("v0") and not lock.held("v999")


async def test_a_ddl_waits_for_the_group_holding_its_vchannel_and_later_data_waits_for_it() -> None:
    lock, gate = LockInterceptor(), Gate()
    release = gate.hold("v0")
    first = asyncio.create_task(
        lock([ctx(MessageType.INSERT, "v0"), ctx(MessageType.INSERT, "v1")], gate)
    )
    await asyncio.sleep(0)
    ddl = asyncio.create_task(lock([ctx(MessageType.DROP_COLLECTION, "v1")], gate))
    await asyncio.sleep(0)
    later = asyncio.create_task(lock([ctx(MessageType.INSERT, "v1")], gate))
    elsewhere = asyncio.create_task(lock([ctx(MessageType.INSERT, "w")], gate))
    await asyncio.sleep(0.01)
    assert gate.order == ["INSERT:v0", "INSERT:w"], "the DDL and the data behind it wait"
    release.set()
    await asyncio.wait_for(asyncio.gather(first, ddl, later, elsewhere), WAIT)
    assert gate.order == ["INSERT:v0", "INSERT:w", "DROP_COLLECTION:v1", "INSERT:v1"]


async def test_a_ddl_cancelled_while_waiting_for_a_group_blocks_nothing() -> None:
    lock, gate = LockInterceptor(), Gate()
    release = gate.hold("v")
    group = asyncio.create_task(lock([ctx(MessageType.INSERT, "v")], gate))
    await asyncio.sleep(0)
    ddl = asyncio.create_task(lock([ctx(MessageType.DROP_COLLECTION, "v")], gate))
    await asyncio.sleep(0.01)
    ddl.cancel()
    await asyncio.gather(ddl, return_exceptions=True)
    after = asyncio.create_task(lock([ctx(MessageType.CREATE_COLLECTION, "x")], gate))
    await asyncio.wait_for(after, WAIT)
    release.set()
    await asyncio.wait_for(group, WAIT)
    assert gate.order == ["INSERT:v", "CREATE_COLLECTION:x"]
    assert not lock.held("v")
