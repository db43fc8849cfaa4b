"""The Pulsar writer: an ``ExclusiveWithFencing`` producer without batching.

A new owner's producer fences the old one: the broker bumps the topic epoch
and the old producer's sends fail with ``ProducerFenced``. The term rule sits
on top (see :mod:`headrace.wal.pulsar.fencing`): before and after taking the
topic the writer reads its last message and refuses a lower term; then it
writes a fence record carrying its term. A writer that loses the topic to a
*lower* term (a stale opener that then gave up) takes it back and resends what
was not acknowledged, so the highest term always wins.

Appends arriving while a group is in flight go out together in the next group
(sent pipelined with ``send_async``; :mod:`headrace.wal.groupcommit`); each
call's records stay in order. A call that finds the writer idle starts sending
at once in the writer's thread (``start_append``).

Each writer has a client (so a TCP connection) of its own. When a producer is
fenced while its sends are on the wire, the broker closes that producer's
whole connection; the client then resends the unacknowledged messages of every
other producer on it, and the broker (without deduplication) stores again
those it had already persisted. A connection per writer keeps one pchannel's
handoff from duplicating records of the others.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pulsar

from headrace import errors
from headrace.message.ids import MessageID
from headrace.wal.contract import BackendWriter
from headrace.wal.groupcommit import Future, GroupCommit, failed
from headrace.wal.pulsar import client
from headrace.wal.pulsar.fencing import Kind, Stamp, fence_check, overtaken
from headrace.wal.pulsar.message_id import PulsarMessageID
from headrace.wal.pulsar.settings import PulsarSettings

_MAX_REACQUIRE = 3


def producer_options(settings: PulsarSettings) -> dict[str, Any]:
    """Keyword arguments of ``create_producer`` besides the access mode: no batching."""
    return {
        "batching_enabled": False,
        "block_if_queue_full": True,
        "max_pending_messages": 2000,
        "send_timeout_millis": settings.send_timeout_ms,
    }


class _LostTopic(Exception):
    """The producer was fenced by somebody; decide whether to take it back."""


class _Sends:
    """Results of pipelined sends, in send order (callbacks run on client threads)."""

    def __init__(self, count: int) -> None:
        self.ids: list[PulsarMessageID] = []
        self.failure: Any = None
        self._left = count
        self._done = threading.Event()
        self._lock = threading.Lock()
        if count == 0:
            self._done.set()

    def done(self, result: Any, message_id: Any) -> None:
        with self._lock:
            if result == pulsar.Result.Ok and self.failure is None:
                self.ids.append(client.from_pulsar(message_id))
            elif self.failure is None:
                self.failure = result
            self._left -= 1
            if self._left == 0:
                self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)


class PulsarWriter(BackendWriter):
    def __init__(self, settings: PulsarSettings, pchannel: str, term: int) -> None:
        self.pchannel = pchannel
        self.term = term
        self._settings = settings
        self._client = client.new_client(settings)
        self._topic = settings.topic(pchannel)
        self._nonce = secrets.randbits(63)
        self._data_props = Stamp(Kind.DATA, term, self._nonce).properties()
        self._producer: Any = None
        self._executor = concurrent.futures.ThreadPoolExecutor(1, f"pulsar-writer-{pchannel}")
        self._group = GroupCommit(
            self._write, self._executor, what=f"pulsar append to {self._topic}"
        )
        self._closed = False

    # ---- opening ---------------------------------------------------------------------

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._acquire, False)
        except BaseException:
            await self.close()
            raise

    def _check(self, *, reacquire: bool) -> PulsarMessageID | None:
        """Raise Fenced if a higher term holds the topic; the last data message's id."""
        last = client.read_last(self._client, self._settings, self._topic)
        found = client.stamp(last) if last is not None else None
        fenced = fence_check(self.pchannel, self.term, self._nonce, found, reacquire=reacquire)
        if fenced is not None:
            raise fenced
        if last is None or found is None:
            return None
        if found.kind is Kind.DATA:
            return client.from_pulsar(last.message_id())
        return found.prev

    def _acquire(self, reacquire: bool) -> None:
        """Take the topic and write the fence record (blocking)."""
        for _ in range(_MAX_REACQUIRE):
            self._check(reacquire=reacquire)
            self._drop_producer()
            try:
                self._producer = self._client.create_producer(
                    self._topic,
                    access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing,
                    **producer_options(self._settings),
                )
            except pulsar.PulsarException as exc:
                raise client.translate(exc, f"taking {self._topic}", self._settings) from None
            prev = self._check(reacquire=reacquire)
            fence = Stamp(Kind.FENCE, self.term, self._nonce, prev).properties()
            try:
                [fence_id] = self._send([b""], fence)
            except _LostTopic:
                reacquire = True
                continue
            self._verify(prev, fence_id, reacquire=reacquire)
            return
        raise self._gave_up()

    def _verify(
        self, prev: PulsarMessageID | None, fence_id: PulsarMessageID, *, reacquire: bool
    ) -> None:
        """Raise Fenced if a record of a term that fences this writer lies before its
        fence record, after the last data message the check saw.

        Pulsar orders a topic's writes, and a record that was in flight when
        this writer's producer took the topic is stored before the fence; the
        look at the end (``_check``) may not have seen it. Reading the range
        back from storage makes the order of fencing follow term order.
        """
        before = client.read_stamps(self._client, self._settings, self._topic, prev, fence_id)
        found = overtaken(self.pchannel, self.term, self._nonce, before, prev, reacquire=reacquire)
        if found is None:
            return
        try:
            self._send([b""], found.restore.properties())
        except (_LostTopic, errors.Unavailable) as exc:
            client.LOG.debug("%s: no restore record after a stale fence: %r", self._topic, exc)
        self._drop_producer()
        raise found.fenced

    def _gave_up(self) -> errors.Unavailable:
        return errors.Unavailable(
            f"pulsar: pchannel {self.pchannel} ({self._topic}) kept losing its producer to "
            f"other openers; gave up after {_MAX_REACQUIRE} attempts"
        )

    # ---- appending -------------------------------------------------------------------

    async def append(self, records: Sequence[bytes]) -> list[MessageID]:
        return await self.start_append(records)

    def start_append(
        self, records: Sequence[bytes], on_done: Callable[[Future], None] | None = None
    ) -> Future:
        """:meth:`append`, whose sends start now if no group is in flight."""
        if self._closed:
            closed = f"pulsar writer of {self.pchannel} (term {self.term}) is closed"
            return failed(errors.Closed(closed), on_done)
        return self._group.start([bytes(r) for r in records], on_done)

    def _write(self, batch: list[bytes]) -> list[PulsarMessageID]:
        """Send ``batch``; on losing the topic to a lower term, take it back and resend."""
        if self._group.fenced is not None:
            raise self._group.fenced
        written: list[PulsarMessageID] = []
        for _ in range(_MAX_REACQUIRE):
            if self._producer is None:
                self._acquire(True)
            try:
                written += self._send(batch[len(written) :], self._data_props)
                return written
            except _LostTopic as lost:
                written += lost.args[0]
        raise self._gave_up()

    def _send(self, batch: list[bytes], properties: dict[str, str]) -> list[PulsarMessageID]:
        producer = self._producer
        sends = _Sends(len(batch))
        try:
            done = sends.done
            for data in batch:
                producer.send_async(data, done, properties=properties)
        except pulsar.PulsarException as exc:
            self._drop_producer()
            if isinstance(exc, pulsar.ProducerFenced | pulsar.AlreadyClosed):
                raise _LostTopic(list(sends.ids)) from None
            raise client.translate(exc, f"appending to {self._topic}", self._settings) from None
        if not sends.wait(
            self._settings.send_timeout_ms / 1000 + self._settings.operation_timeout_s
        ):
            self._drop_producer()
            raise errors.Unavailable(
                f"pulsar: sends to {self._topic} were not answered in time "
                f"({self._settings.service_url}); none of this append was acknowledged"
            )
        if sends.failure is None:
            return sends.ids
        first = sends.failure
        if first == pulsar.Result.MessageTooBig:
            largest = max(map(len, batch))
            raise errors.MessageTooLarge(
                f"pulsar: a record ({largest} bytes at most) is larger than {self._topic} "
                f"accepts ({self._settings.service_url}); it was not written"
                + ("" if len(batch) == 1 else ", the other records of the call may have been")
            )
        self._drop_producer()
        if first in (pulsar.Result.ProducerFenced, pulsar.Result.AlreadyClosed):
            raise _LostTopic(list(sends.ids))
        raise errors.Unavailable(
            f"pulsar: appending to {self._topic} failed with {first} "
            f"({self._settings.service_url}); a prefix of the records may have been written"
        )

    def _drop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.close()
            except pulsar.PulsarException as exc:
                client.LOG.debug("closing a lost producer of %s: %s", self._topic, exc)

    # ---- closing ---------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._group.drain()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._release)
        self._executor.shutdown(wait=False)

    def _release(self) -> None:
        self._drop_producer()
        try:
            self._client.close()
        except pulsar.PulsarException as exc:
            client.LOG.debug("closing the client of %s: %s", self._topic, exc)
