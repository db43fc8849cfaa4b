"""The consumer: one vchannel's messages, resumed across owner changes.

A :class:`Consumer` keeps the id and timetick of the last message it
delivered. When the stream breaks or the pchannel moves, it finds the owner
again and resumes with ``START_AFTER(last id)`` and ``timetick_gt = last
timetick``, so nothing is delivered twice or skipped. A move is noticed in
the metastore too, as producers notice it: once an owner of a higher term is
ASSIGNED, the stream to the old owner is given up even if that owner never
answers or ends it (a paused or partitioned node). A start position that
was truncated away raises :class:`headrace.errors.Truncated` naming the
earliest readable id.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import operator
import time
from collections.abc import Collection

import grpc

from headrace import errors
from headrace.client import arguments
from headrace.client.arguments import Start
from headrace.client.discovery import ClusterView, Owner
from headrace.client.errors import from_rpc_error
from headrace.client.session import Session
from headrace.guarded import TaskFailure, cancel_and_settle, guarded_task
from headrace.message import batch, ids
from headrace.message.ids import MessageID
from headrace.message.types import LogEntry, Message, MessageType, type_of
from headrace.proto import rpc
from headrace.proto import streaming_pb2 as pb

log = logging.getLogger(__name__)

ConsumeCall = rpc.ConsumeCall

_DATA_TYPES = frozenset(t for t in MessageType if not t.is_system)
_new_tuple = tuple.__new__
_message_of = operator.itemgetter(1)


@dataclasses.dataclass(frozen=True, slots=True)
class ConsumerOptions:
    ready_timeout: float = 60.0
    """Seconds to find a serving owner before ``__anext__`` raises Unavailable."""
    max_batch_messages: int = 0
    """Per response; 0 takes the node's default."""
    max_batch_bytes: int = 0
    retry_backoff: float = 0.05
    max_retry_backoff: float = 1.0


def to_entry(proto: pb.ConsumedMessage) -> LogEntry:
    """The delivered message; CorruptData if the node sent something unreadable."""
    try:
        mtype = MessageType(proto.type)
    except ValueError:
        raise errors.CorruptData(f"unknown message type code {proto.type} from the node") from None
    mid = ids.parse(proto.id)
    message = Message(
        mtype,
        proto.vchannel,
        proto.payload,
        dict(proto.properties),
        proto.timetick,
        proto.term,
        proto.txn_id,
    )
    return LogEntry(mid, message)


def _entry(pair: tuple[MessageID, Message]) -> LogEntry:
    return _new_tuple(LogEntry, pair)


def item_entries(item: pb.ConsumedItem) -> list[LogEntry]:
    """The messages of one item of a Consume response (a message, or a record
    batch checked whole); CorruptData if the node sent something unreadable."""
    if item.WhichOneof("item") != "batch":
        return [to_entry(item.message)]
    unit = item.batch
    msgs = batch.messages(unit.data)
    # The ids column by column and the entries as plain tuples: a third of
    # the cost per message of one ``with_index`` and ``LogEntry(...)`` each.
    return list(map(_entry, zip(ids.parse(unit.first_id).indexed(len(msgs)), msgs, strict=True)))


@dataclasses.dataclass(slots=True)
class _Run:
    """Received messages in order, taken from ``at`` on."""

    entries: list[LogEntry]
    own: bool
    """Every message is the consumer's (its vchannel or none, its types) and
    the timeticks rise: taken by slices, without a look at each message."""
    at: int = 0


def _own_run(entries: list[LogEntry], vchannel: str, types: frozenset[MessageType]) -> bool:
    """Whether a decoded record batch is all ``vchannel``'s (or the
    pchannel's) messages of ``types`` (pure; a batch holds one vchannel and
    rising timeticks, so its first message tells the vchannel)."""
    if not entries:
        return False
    first = entries[0].message.vchannel
    return (not first or first == vchannel) and types.issuperset(
        map(type_of, map(_message_of, entries))
    )


Inbound = pb.ConsumeResponse | Owner | errors.HeadraceError
"""What a stream hands its consumer: a response, the owner that superseded the
stream's owner, or the error that ended the stream."""


class _Stream:
    """One Consume stream, read ahead by a task into ``inbox``.

    A second task puts the owner that supersedes the stream's owner into the
    same inbox once the cluster view records it: a stopped owner neither
    answers nor ends its stream, so only the view can tell the consumer to
    leave. A cancelled wait on the inbox loses nothing, so the stream outlives
    a timeout of :meth:`Consumer.next`.
    """

    def __init__(self, owner: Owner, call: ConsumeCall, view: ClusterView) -> None:
        self.owner = owner
        self.call = call
        self.inbox: asyncio.Queue[Inbound] = asyncio.Queue(maxsize=2)
        name = f"consume-{owner.pchannel}-{owner.term}"
        self._tasks = (
            guarded_task(self._pump(), name, self._on_failure, finishable=True, logger=log),
            guarded_task(
                self._watch(view),
                f"{name}-successor",
                self._on_failure,
                finishable=True,
                logger=log,
            ),
        )

    async def _on_failure(self, failure: TaskFailure) -> None:
        """A bug in a task of the stream fails the consumer (not retryable)
        instead of leaving it waiting."""
        await self.inbox.put(
            errors.HeadraceError(f"consuming from {self.owner.address}: {failure.describe()}")
        )

    async def _pump(self) -> None:
        address = self.owner.address
        try:
            while True:
                response = await self.call.read()
                if not isinstance(response, pb.ConsumeResponse):
                    await self.inbox.put(errors.Unavailable(f"{address} ended the Consume stream"))
                    return
                await self.inbox.put(response)
        except grpc.RpcError as exc:
            await self.inbox.put(from_rpc_error(exc, address))

    async def _watch(self, view: ClusterView) -> None:
        try:
            successor = await view.wait_successor(self.owner)
        except errors.HeadraceError as exc:
            # The client was closed, or its view of the cluster failed.
            await self.inbox.put(exc)
            return
        await self.inbox.put(successor)

    async def next(self) -> Inbound:
        return await self.inbox.get()

    def cancel(self) -> None:
        self.call.cancel()
        for task in self._tasks:
            task.cancel()

    async def close(self) -> None:
        self.cancel()
        await cancel_and_settle(
            self._tasks, what=f"closing the Consume stream from {self.owner.address}", logger=log
        )


class Consumer:
    """Async iterator of :class:`LogEntry`; create with :meth:`HeadraceClient.consume`."""

    def __init__(
        self,
        session: Session,
        vchannel: str,
        start: Start,
        types: Collection[MessageType] | None,
        options: ConsumerOptions,
    ) -> None:
        self.session = session
        self.vchannel = arguments.vchannel(vchannel)
        self.start = arguments.start(start)
        self.types = _DATA_TYPES if types is None else arguments.message_types(types)
        self.options = arguments.instance(options, ConsumerOptions, "options")
        self.last_id: MessageID | None = None
        """Where a reconnect resumes: the last message received (delivered or skipped)."""
        self.last_timetick = 0
        self.owner: Owner | None = None
        self.reconnects = 0
        self._stream: _Stream | None = None
        self._buffer: collections.deque[_Run] = collections.deque()
        """Received messages decoded and not yet taken, a run per record batch
        (or per response's plain messages)."""
        self._undecoded: collections.deque[pb.ConsumedItem] = collections.deque()
        """Received items (record batches) behind ``_buffer``, decoded one at a
        time as they are reached: the first batch of a response is handed out
        without waiting for the rest to be decoded."""
        self._avoid: Owner | None = None
        self._backoff = self.options.retry_backoff
        self._closed = False

    def __aiter__(self) -> Consumer:
        return self

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def __anext__(self) -> LogEntry:
        while True:
            if self._closed:
                raise StopAsyncIteration
            entry = self._received()
            if entry is not None:
                return entry
            await self._fill()

    def _received(self) -> LogEntry | None:
        """The next received message this consumer delivers (its vchannel and types),
        passing over the others and decoding received items as it reaches them;
        None once nothing received is left."""
        while True:
            taken = self._take_received(1)
            if taken:
                return taken[0]
            if not self._undecoded:
                return None
            entries = item_entries(self._undecoded.popleft())
            if entries:
                self._buffer.append(_Run(entries, _own_run(entries, self.vchannel, self.types)))

    def _take_received(self, most: int | None) -> list[LogEntry]:
        """The next decoded messages this consumer delivers, ``most`` at most
        (None: all), passing over the others; every message passed or taken
        moves the resume position (``last_id``, ``last_timetick``)."""
        buffer = self._buffer
        taken: list[LogEntry] = []
        while buffer and (most is None or len(taken) < most):
            run = buffer[0]
            left = None if most is None else most - len(taken)
            if run.own:
                self._take_own(run, taken, left)
            else:
                self._take_mixed(run, taken, left)
            if run.at == len(run.entries):
                buffer.popleft()
        return taken

    def _take_own(self, run: _Run, taken: list[LogEntry], most: int | None) -> None:
        """Take ``most`` (None: all) of an own run (:class:`_Run`) into ``taken`` at once."""
        entries = run.entries
        stop = len(entries) if most is None else min(len(entries), run.at + most)
        taken += entries[run.at : stop]
        run.at = stop
        last = entries[stop - 1]
        self.last_id = last.id
        self.last_timetick = max(self.last_timetick, last.message.timetick)

    def _take_mixed(self, run: _Run, taken: list[LogEntry], most: int | None) -> None:
        """Take ``most`` (None: all) of a run's messages this consumer
        delivers into ``taken``, looking at each and passing over the others."""
        entries = run.entries
        vchannel = self.vchannel
        types = self.types
        newest = self.last_timetick
        found = 0
        at = run.at
        while at < len(entries) and (most is None or found < most):
            message = entries[at].message
            at += 1
            newest = max(newest, message.timetick)
            if message.vchannel and message.vchannel != vchannel:
                continue
            if message.type in types:
                taken.append(entries[at - 1])
                found += 1
        self.last_id = entries[at - 1].id
        self.last_timetick = newest
        run.at = at

    async def next_many(self, limit: int = 1024, timeout: float | None = None) -> list[LogEntry]:
        """The next message and every other already received and decoded,
        ``limit`` at most: what a reader at a high rate takes at once, waiting
        once per response instead of once per message. A response's record
        batches are decoded as they are reached, so this hands out the first
        batch that holds a message for it (with what was decoded before) and
        leaves the later batches of that response to the next calls, which
        take them without waiting. Empty if nothing arrives within ``timeout``
        seconds."""
        most = arguments.count(limit, "limit")
        if most == 0:
            raise errors.InvalidArgument("limit must be at least 1, got 0")
        first = await self.next(timeout)
        if first is None:
            return []
        return [first, *self._take_received(None if most is None else most - 1)]

    async def next(self, timeout: float | None = None) -> LogEntry | None:
        """The next message, or None if none arrives within ``timeout`` seconds."""
        timeout = arguments.timeout(timeout)
        try:
            async with asyncio.timeout(timeout):
                return await self.__anext__()
        except TimeoutError:
            return None

    async def close(self) -> None:
        self._closed = True
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.close()

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None

    async def _fill(self) -> None:
        """Read the next response into the buffer, reconnecting as needed."""
        stream = self._stream
        if stream is None:
            try:
                stream = self._stream = await self._open()
            except errors.HeadraceError as exc:
                await self._retry_or_raise(exc)
                return
        inbound = await stream.next()
        if isinstance(inbound, Owner):
            self._leave(stream, inbound)
            return
        if isinstance(inbound, errors.HeadraceError):
            await self._retry_or_raise(inbound)
            return
        self._backoff = self.options.retry_backoff
        self._avoid = None
        if inbound.start_after_id and self.last_id is None:
            # Resolved "latest": a reconnect resumes here, not at a later "latest".
            self.last_id = ids.parse(inbound.start_after_id)
            self.last_timetick = inbound.start_after_timetick
        if inbound.messages:
            self._buffer.append(_Run([to_entry(m) for m in inbound.messages], own=False))
        self._undecoded.extend(inbound.items)

    def _leave(self, stream: _Stream, successor: Owner) -> None:
        """Give up ``stream``: ``successor`` serves its pchannel under a higher term."""
        log.info(
            "consuming %s: %s moved to %s at term %d; leaving %s (term %d)",
            self.vchannel,
            successor.pchannel,
            successor.node,
            successor.term,
            stream.owner.address,
            stream.owner.term,
        )
        self._drop_stream()
        self._avoid = stream.owner
        self.owner = None
        self.reconnects += 1

    async def _retry_or_raise(self, error: errors.HeadraceError) -> None:
        self._drop_stream()
        if not error.retryable:
            raise error
        log.info("consuming %s: %s; reconnecting", self.vchannel, error)
        self._avoid = self.owner
        self.owner = None
        self.reconnects += 1
        await asyncio.sleep(self._backoff)
        self._backoff = min(self._backoff * 2, self.options.max_retry_backoff)

    async def _open(self) -> _Stream:
        """A Consume stream to the pchannel's owner, resuming where delivery stopped."""
        view = self.session.view
        deadline = time.monotonic() + self.options.ready_timeout
        pchannel = await view.wait_route(self.vchannel, deadline)
        owner: Owner | None = None
        if self._avoid is not None:
            try:
                owner = await view.wait_owner(
                    pchannel, min(deadline, time.monotonic() + self._backoff), avoid=self._avoid
                )
            except errors.Unavailable:
                owner = None
        if owner is None:
            owner = await view.wait_owner(pchannel, deadline)
        self.owner = owner
        stub = rpc.consumer_stub(self.session.channels.get(owner.address))
        call = stub.Consume(self._request(pchannel))
        return _Stream(owner, call, view)

    def _request(self, pchannel: str) -> pb.ConsumeRequest:
        request = pb.ConsumeRequest(
            pchannel=pchannel,
            vchannels=[self.vchannel],
            types=sorted(int(t) for t in self.types),
            max_batch_messages=self.options.max_batch_messages,
            max_batch_bytes=self.options.max_batch_bytes,
            accept_batches=True,
        )
        if self.last_id is not None:
            request.policy = pb.DELIVER_POLICY_START_AFTER
            request.start_id = str(self.last_id)
            request.timetick_gt = self.last_timetick
        elif isinstance(self.start, MessageID):
            request.policy = pb.DELIVER_POLICY_START_FROM
            request.start_id = str(self.start)
        elif self.start == "latest":
            request.policy = pb.DELIVER_POLICY_LATEST
        else:
            request.policy = pb.DELIVER_POLICY_ALL
        return request


__all__ = ["ConsumeCall", "Consumer", "ConsumerOptions", "Start", "to_entry"]
