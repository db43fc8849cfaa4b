"""The consumer: one vchannel's messages, resumed across owner changes.

A :class:`Consumer` keeps the id and timetick of the last message it
delivered. When the stream breaks or the pchannel moves, it finds the owner
again and resumes with ``START_AFTER(last id)`` and ``timetick_gt = last
timetick``, so nothing is delivered twice or skipped. A start position that
was truncated away raises :class:`headrace.errors.Truncated` naming the
earliest readable id.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Literal

import grpc

from headrace import errors
from headrace.client.discovery import Owner
from headrace.client.errors import from_rpc_error
from headrace.message import ids
from headrace.message.ids import MessageID
from headrace.message.types import LogEntry, Message, MessageType
from headrace.proto import rpc
from headrace.proto import streaming_pb2 as pb

if TYPE_CHECKING:
    from headrace.client.client import HeadraceClient

log = logging.getLogger(__name__)

Start = Literal["earliest", "latest"] | MessageID
ConsumeCall = rpc.ConsumeCall

_DATA_TYPES = frozenset(t for t in MessageType if not t.is_system)


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


class Consumer:
    """Async iterator of :class:`LogEntry`; create with :meth:`HeadraceClient.consume`."""

    def __init__(
        self,
        client: HeadraceClient,
        vchannel: str,
        start: Start,
        types: Collection[MessageType] | None,
        options: ConsumerOptions,
    ) -> None:
        if not isinstance(start, MessageID) and start not in ("earliest", "latest"):
            raise errors.InvalidArgument(
                f"start must be 'earliest', 'latest' or a message id, got {start!r}"
            )
        self.client = client
        self.vchannel = vchannel
        self.start = start
        self.types = frozenset(_DATA_TYPES if types is None else types)
        self.options = options
        self.last_id: MessageID | None = None
        """Where a reconnect resumes: the last message received (delivered or skipped)."""
        self.last_timetick = 0
        self.owner: Owner | None = None
        self.reconnects = 0
        self._call: ConsumeCall | None = None
        self._buffer: collections.deque[pb.ConsumedMessage] = collections.deque()
        self._avoid: Owner | None = None
        self._backoff = options.retry_backoff
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
            while self._buffer:
                proto = self._buffer.popleft()
                entry = to_entry(proto)
                self.last_id = entry.id
                self.last_timetick = max(self.last_timetick, entry.message.timetick)
                vchannel = entry.message.vchannel
                if vchannel and vchannel != self.vchannel:
                    continue
                if entry.message.type not in self.types:
                    continue
                return entry
            await self._fill()

    async def next(self, timeout: float | None = None) -> LogEntry | None:
        """The next message, or None if none arrives within ``timeout`` seconds."""
        try:
            async with asyncio.timeout(timeout):
                return await self.__anext__()
        except TimeoutError:
            return None

    async def close(self) -> None:
        self._closed = True
        self._drop_call()

    def _drop_call(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None

    async def _fill(self) -> None:
        """Read the next response into the buffer, reconnecting as needed."""
        try:
            if self._call is None:
                self._call = await self._connect()
            response = await self._call.read()
            if not isinstance(response, pb.ConsumeResponse):
                raise errors.Unavailable("the node ended the Consume stream")
        except asyncio.CancelledError:
            # A read given up half way (a timeout of next()): resume by position later.
            self._drop_call()
            raise
        except grpc.RpcError as exc:
            where = self.owner.address if self.owner else "node"
            await self._retry_or_raise(from_rpc_error(exc, where))
            return
        except errors.HeadraceError as exc:
            await self._retry_or_raise(exc)
            return
        self._backoff = self.options.retry_backoff
        self._buffer.extend(response.messages)

    async def _retry_or_raise(self, error: errors.HeadraceError) -> None:
        self._drop_call()
        if not error.retryable:
            raise error
        log.info("consuming %s: %s; reconnecting", self.vchannel, error)
        self._avoid = self.owner
        self.owner = None
        self.reconnects += 1
        await asyncio.sleep(self._backoff)
        self._backoff = min(self._backoff * 2, self.options.max_retry_backoff)

    async def _connect(self) -> ConsumeCall:
        view = self.client.view
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
        stub = rpc.consumer_stub(self.client.channels.get(owner.address))
        call = stub.Consume(self._request(pchannel))
        header = await call.read()
        if not isinstance(header, pb.ConsumeResponse):
            call.cancel()
            raise errors.Unavailable(f"{owner.address} ended the Consume stream at once")
        self._avoid = None
        if header.start_after_id and self.last_id is None:
            # Resolved "latest": a reconnect resumes here, not at a later "latest".
            self.last_id = ids.parse(header.start_after_id)
            self.last_timetick = header.start_after_timetick
        self._buffer.extend(header.messages)
        return call

    def _request(self, pchannel: str) -> pb.ConsumeRequest:
        request = pb.ConsumeRequest(
            pchannel=pchannel,
            vchannels=[self.vchannel],
            types=sorted(int(t) for t in self.types),
            max_batch_messages=self.options.max_batch_messages,
            max_batch_bytes=self.options.max_batch_bytes,
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
