"""The producer: batched, pipelined, retried appends to the owners of pchannels.

Each pchannel gets a :class:`_Lane`: a queue of messages and one Produce
stream to the pchannel's owner at a time, with up to ``max_inflight_batches``
batches on the wire. Messages are stamped with ``producer_id`` and a
``producer_seq`` once, so a retried message is written once (the WAL's dedup
interceptor answers a repeat with the first result). A retryable failure
(NOT_OWNER, FENCED, UNAVAILABLE, a broken stream) sends the unacknowledged
messages again, in their order, to the owner found next; a non-retryable one
(TOO_LARGE, INVALID_ARGUMENT) fails its message at once. A message still not
acknowledged after ``deadline`` seconds fails with the last error seen.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from headrace import errors
from headrace.client.budget import ByteBudget
from headrace.client.discovery import Owner
from headrace.client.lane import Item, Lane
from headrace.message.types import Message, MessageType
from headrace.wal.api import AppendResult
from headrace.wal.interceptors.dedup import PRODUCER_ID, PRODUCER_SEQ

if TYPE_CHECKING:
    from headrace.client.client import HeadraceClient


@dataclasses.dataclass(frozen=True, slots=True)
class ProducerOptions:
    max_batch_messages: int = 512
    max_batch_bytes: int = 1 << 20
    linger: float = 0.0
    """Seconds a part-filled batch waits for more messages (0: send what is queued)."""
    max_inflight_bytes: int = 64 << 20
    """Bytes of unacknowledged messages; ``send`` waits while they are more."""
    max_inflight_batches: int = 8
    """Batches on the wire per pchannel before the first is answered."""
    deadline: float = 60.0
    """Seconds a message may take, retries included, before it fails."""
    retry_backoff: float = 0.05
    max_retry_backoff: float = 1.0

    def __post_init__(self) -> None:
        if self.max_batch_messages < 1 or self.max_batch_bytes < 1:
            raise errors.InvalidArgument("batch limits must be positive")
        if self.max_inflight_batches < 1 or self.max_inflight_bytes < 1:
            raise errors.InvalidArgument("in-flight limits must be positive")
        if self.deadline <= 0:
            raise errors.InvalidArgument(f"deadline must be positive, got {self.deadline}")


class Group:
    """The outcomes of one ``send``/``send_many`` call."""

    __slots__ = ("future", "remaining", "results")

    def __init__(self, count: int) -> None:
        self.future: asyncio.Future[list[AppendResult | errors.HeadraceError]] = (
            asyncio.get_running_loop().create_future()
        )
        self.results: list[AppendResult | errors.HeadraceError] = [_PENDING] * count
        self.remaining = count
        if count == 0:
            self.future.set_result([])

    def settle(self, index: int, outcome: AppendResult | errors.HeadraceError) -> None:
        self.results[index] = outcome
        self.remaining -= 1
        if self.remaining == 0 and not self.future.done():
            self.future.set_result(self.results)


_PENDING = errors.Unavailable("not sent yet")


class Producer:
    """Sends messages to a cluster; create with :meth:`HeadraceClient.producer`."""

    def __init__(self, client: HeadraceClient, options: ProducerOptions) -> None:
        self.client = client
        self.options = options
        self.producer_id = uuid.uuid4().hex
        self._seq = itertools.count(1)
        self.budget = ByteBudget(options.max_inflight_bytes)
        self._lanes: dict[str, Lane] = {}
        self._closed = False

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def send(
        self,
        vchannel: str,
        payload: bytes,
        *,
        type: MessageType = MessageType.INSERT,
        properties: Mapping[str, str] | None = None,
        txn_id: int = 0,
    ) -> AppendResult:
        """Append one message; its result once acknowledged, else its error."""
        message = Message(type, vchannel, payload, properties or {}, txn_id=txn_id)
        (outcome,) = await self.send_many((message,))
        if isinstance(outcome, errors.HeadraceError):
            raise outcome
        return outcome

    async def send_many(
        self, messages: Iterable[Message]
    ) -> list[AppendResult | errors.HeadraceError]:
        """Append messages; one result or error per message, in their order.

        Messages of one vchannel are written in the order given.
        """
        if self._closed:
            raise errors.Closed("the producer is closed")
        batch = list(messages)
        group = Group(len(batch))
        view = self.client.view
        deadline = time.monotonic() + self.options.deadline
        lanes: dict[str, Lane] = {}
        for index, msg in enumerate(batch):
            lane = lanes.get(msg.vchannel)
            if lane is None:
                if view.config is None:
                    await view.wait_route(msg.vchannel, deadline)
                lane = lanes[msg.vchannel] = self._lane(view.route(msg.vchannel))
            item = self._item(msg, group, index, deadline)
            await self.budget.acquire(item.size)
            lane.push(item)
        return await group.future

    def _lane(self, pchannel: str) -> Lane:
        lane = self._lanes.get(pchannel)
        if lane is None:
            lane = self._lanes[pchannel] = Lane(self, pchannel)
        return lane

    def _item(self, msg: Message, group: Group, index: int, deadline: float) -> Item:
        properties = dict(msg.properties)
        properties[PRODUCER_ID] = self.producer_id
        properties[PRODUCER_SEQ] = str(next(self._seq))
        size = len(msg.payload) + len(msg.vchannel) + 96
        return Item(msg, properties, size, group, index, deadline)

    def settle(self, item: Item, outcome: AppendResult | errors.HeadraceError) -> None:
        """Report ``item``'s outcome and give back its bytes."""
        self.budget.release(item.size)
        item.group.settle(item.index, outcome)

    async def flush(self) -> None:
        """Wait until every message sent so far has its outcome."""
        await asyncio.gather(*(lane.idle() for lane in list(self._lanes.values())))

    async def close(self) -> None:
        """Flush, then end every stream."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.flush()
        finally:
            lanes, self._lanes = list(self._lanes.values()), {}
            await asyncio.gather(*(lane.close() for lane in lanes))

    def owners(self) -> dict[str, Owner | None]:
        """The owner each pchannel's stream is connected to (for status output)."""
        return {p: lane.owner for p, lane in self._lanes.items()}


__all__ = ["Group", "Producer", "ProducerOptions"]
