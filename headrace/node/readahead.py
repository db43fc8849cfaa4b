"""Read-ahead of a Consume stream: the next response fills while the last is sent.

gRPC sends one message of a stream at a time, and a handler that reads the
WAL only after its previous response was sent adds that whole send to the
delay of every entry that arrives meanwhile. :class:`ReadAhead` splits the
two: a task (:meth:`ReadAhead.run`) moves entries from the scanner into a
holding deque while the stream's writer sends, and the writer
(:meth:`ReadAhead.next_response`) packs everything held, up to one
response's bounds, as soon as the previous send is done: entries that
arrived during a send go together in the next response.

Memory stays bounded whatever the client does: the task reads only while
the deque holds fewer than the response bounds' messages and bytes, and a
read takes at most the messages left to the message bound and (at the size
of the messages read last) to the byte bound, or one record batch whole; so
a stream holds about one response's worth of entries beyond the one gRPC is
sending (a read can pass the byte bound by what its messages are larger than
the last ones). A client that stops reading stops the
writer (its send waits for the HTTP/2 window), hence the task. The task
ends on the first error of the scanner (or the WAL no longer served here);
the writer raises it once the entries read before it were handed out.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Callable

from headrace import errors
from headrace.guarded import TaskFailure
from headrace.message.records import BatchEntry
from headrace.message.types import LogEntry
from headrace.node import convert
from headrace.proto import streaming_pb2 as pb
from headrace.wal.scanner import Scanner

Entry = LogEntry | BatchEntry


@dataclasses.dataclass(frozen=True, slots=True)
class Bounds:
    """What one Consume response may hold, and in which form."""

    messages: int
    bytes: int
    batches: bool
    """The client reads record batches (responses carry ``items``)."""


@dataclasses.dataclass(slots=True)
class ConsumeStats:
    """Flow-control bookkeeping of one Consume stream."""

    pchannel: str
    pulled: int = 0
    """Messages taken from the scanner."""
    sent: int = 0
    """Messages handed to gRPC (whose write waits for the client's window)."""
    max_ahead: int = 0
    """Most messages pulled but not yet handed to gRPC at any time."""


@dataclasses.dataclass(frozen=True, slots=True)
class Source:
    """Where a read-ahead reads and how it knows the WAL is still served."""

    scanner: Scanner
    poll_seconds: float
    """How long one read waits before the task checks ``refusal``."""
    refusal: Callable[[], errors.HeadraceError | None]
    """Why the stream must end although the scanner has nothing to say (the
    WAL moved away from this node); None while it is served."""


def room_for(bounds: Bounds, held_messages: int, held_bytes: int, message_bytes: int) -> int:
    """How many messages the task may read now (pure): what is left of one
    response's message bound, and no more than fit in what is left of its
    byte bound at ``message_bytes`` a message (what the last read's messages
    counted on average; 0: not known yet, so one message, or one whole record
    batch, goes first); 0 once the held entries reach either bound."""
    if held_bytes >= bounds.bytes:
        return 0
    left = bounds.messages - held_messages
    if message_bytes <= 0:
        return min(1, left)
    fits = -(-(bounds.bytes - held_bytes) // message_bytes)
    return max(0, min(left, fits))


class ReadAhead:
    """The entries of one Consume stream read ahead of its sends (see the module)."""

    def __init__(self, source: Source, bounds: Bounds, stats: ConsumeStats) -> None:
        self.source = source
        self.bounds = bounds
        self.stats = stats
        self._held: collections.deque[Entry] = collections.deque()
        self._held_messages = 0
        self._held_bytes = 0
        self._message_bytes = 0
        """What a message of the last read counted, on average (0: nothing read yet)."""
        self._end: errors.HeadraceError | None = None
        """Why the task stopped reading: the writer raises it once ``_held`` is empty."""
        self._ready = asyncio.Event()
        """Set while something is held or the task ended."""
        self._room = asyncio.Event()
        """Set while the task may read (``room_for`` is positive)."""
        self._room.set()

    @property
    def held_messages(self) -> int:
        return self._held_messages

    @property
    def held_bytes(self) -> int:
        return self._held_bytes

    async def run(self) -> None:
        """The task: read while there is room, until the scanner fails or the
        WAL is no longer served here."""
        source = self.source
        bounds = self.bounds
        while self._end is None:
            room = room_for(bounds, self._held_messages, self._held_bytes, self._message_bytes)
            if room == 0:
                self._room.clear()
                await self._room.wait()
                continue
            try:
                if bounds.batches:
                    entries = await source.scanner.next_units(room, source.poll_seconds)
                else:
                    entries = list(await source.scanner.next_many(room, source.poll_seconds))
            except errors.HeadraceError as exc:
                self._finish(exc)
                return
            if entries:
                self._hold(entries)
                continue
            refusal = source.refusal()
            if refusal is not None:
                self._finish(refusal)

    async def failed(self, failure: TaskFailure) -> None:
        """The task's end on an unexpected error (the guard logged it): the
        stream ends with an INTERNAL error naming it."""
        self._finish(errors.HeadraceError(f"internal error: {failure.describe()}"))

    def _hold(self, entries: list[Entry]) -> None:
        messages = convert.messages_in(entries)
        size = sum(map(convert.entry_bytes, entries))
        self._held.extend(entries)
        self._held_messages += messages
        self._held_bytes += size
        self._message_bytes = -(-size // max(1, messages))
        stats = self.stats
        stats.pulled += messages
        stats.max_ahead = max(stats.max_ahead, stats.pulled - stats.sent)
        self._ready.set()

    def _finish(self, error: errors.HeadraceError) -> None:
        if self._end is None:
            self._end = error
        self._ready.set()

    async def next_response(self) -> tuple[pb.ConsumeResponse, convert.Packed]:
        """The next response: everything held, up to one response's bounds,
        once there is something; the task's error once nothing read before
        it is left."""
        held = self._held
        while not held:
            if self._end is not None:
                raise self._end
            self._ready.clear()
            await self._ready.wait()
        bounds = self.bounds
        response = pb.ConsumeResponse()
        if bounds.batches:
            packed = convert.pack_items(response.items, held, bounds.messages, bounds.bytes)
        else:
            packed = convert.pack_messages(response.messages, held, bounds.messages, bounds.bytes)
        self._held_messages -= packed.messages
        self._held_bytes -= packed.bytes
        if room_for(bounds, self._held_messages, self._held_bytes, self._message_bytes):
            self._room.set()
        return response, packed
