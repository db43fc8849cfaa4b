"""A bounded read of one vchannel's WAL range through the public consumer.

The public :class:`headrace.client.Consumer` starts at a position (inclusive)
and follows the log forever; it has no end bound and no "start after". This
reader adds both on top of it:

* positions at or before ``start`` (the last checkpoint) are skipped;
* the read ends at ``end`` (the seal the flush runs to): a data message at
  ``end`` is the last one returned; any message past ``end``, or a TIME_TICK
  at or past it, ends the read. The node persists a TIME_TICK shortly after
  any persisted data (and delivers buffer-only ticks carrying the last
  persisted id), and time ticks reach every vchannel's reader, so a vchannel
  with no message after ``end`` still learns that the range is over.

Messages are returned in log order of delivery; transactions are delivered at
their commit, so a flush range must not end inside an open transaction (the
node's seal worker waits for open transactions, as Milvus's does).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from headrace import errors
from headrace.client import ConsumerOptions, HeadraceClient
from headrace.message.ids import MessageID
from headrace.message.types import LogEntry, MessageType

RANGE_TYPES = frozenset(
    {MessageType.INSERT, MessageType.DELETE, MessageType.FLUSH, MessageType.TIME_TICK}
)


@dataclasses.dataclass(frozen=True, slots=True)
class Bounds:
    """``(start, end]``; ``start`` None for the beginning of the log."""

    start: MessageID | None
    end: MessageID

    def ahead(self, position: MessageID) -> bool:
        """At or before the start: already covered by the checkpoint."""
        return self.start is not None and not self.start < position


async def read_range(
    client: HeadraceClient, vchannel: str, bounds: Bounds, idle_timeout_s: float = 60.0
) -> list[LogEntry]:
    """The data messages of ``vchannel`` in ``bounds``, in delivery order.

    Unavailable if nothing arrives for ``idle_timeout_s`` before the end is
    reached (the node is gone and no other took the pchannel over);
    Truncated if ``start`` was truncated away.
    """
    start: MessageID | Literal["earliest"] = "earliest" if bounds.start is None else bounds.start
    found: list[LogEntry] = []
    options = ConsumerOptions(ready_timeout=idle_timeout_s)
    async with client.consume(vchannel, start, RANGE_TYPES, options) as consumer:
        while True:
            entry = await consumer.next(timeout=idle_timeout_s)
            if entry is None:
                raise errors.Unavailable(
                    f"reading {vchannel} up to {bounds.end}: no message for {idle_timeout_s:g}s "
                    f"(last seen {consumer.last_id})"
                )
            if bounds.ahead(entry.id):
                continue
            if bounds.end < entry.id:
                return found
            if entry.message.type is MessageType.TIME_TICK:
                if not entry.id < bounds.end:
                    return found
                continue
            found.append(entry)
            if not entry.id < bounds.end:
                return found
