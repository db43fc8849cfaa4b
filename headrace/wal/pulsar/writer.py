"""The Pulsar writer's link: an ``ExclusiveWithFencing`` producer without batching.

A new owner's producer fences the old one: the broker bumps the topic epoch
and the old producer's sends fail with ``ProducerFenced``. The term rule, the
reacquire loop (a writer that lost the topic to a lower term takes it back and
resends what was not stored) and group commit on top are the toolkit's
(:class:`headrace.wal.brokers.writer.BrokerWriter`). A record in flight when
a new producer takes the topic may be stored before the new fence record
without the opener's look at the end having seen it, so the link reads that
range back (:meth:`PulsarLink.stored`) and the writer yields to a higher term
found there.

Sends of one group go out pipelined with ``send_async``.

Each writer has a client (so a TCP connection) of its own. When a producer is
fenced while its sends are on the wire, the broker closes that producer's
whole connection; the client then resends the unacknowledged messages of every
other producer on it, and the broker (without deduplication) stores again
those it had already persisted. A connection per writer keeps one pchannel's
handoff from duplicating records of the others.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pulsar

from headrace import errors
from headrace.wal.brokers.contract import EMPTY, End, Lost, end_of
from headrace.wal.pulsar import client
from headrace.wal.pulsar.fencing import PulsarStamp, properties
from headrace.wal.pulsar.message_id import PulsarMessageID
from headrace.wal.pulsar.settings import PulsarSettings


def producer_options(settings: PulsarSettings) -> dict[str, Any]:
    """Keyword arguments of ``create_producer`` besides the access mode: no batching."""
    return {
        "batching_enabled": False,
        "block_if_queue_full": True,
        "max_pending_messages": 2000,
        "send_timeout_millis": settings.send_timeout_ms,
    }


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


class PulsarLink:
    """A writer's hold on a pchannel's topic (a toolkit ``Link``)."""

    def __init__(self, settings: PulsarSettings, pchannel: str) -> None:
        self.pchannel = pchannel
        self.topic = settings.topic(pchannel)
        self._settings = settings
        self._client = client.new_client(settings)
        self._producer: Any = None

    def look(self) -> End[PulsarMessageID]:
        last = client.read_last(self._client, self._settings, self.topic)
        if last is None:
            return EMPTY
        return end_of(client.from_pulsar(last.message_id()), client.stamp(last))

    def take(self) -> None:
        self.drop()
        try:
            self._producer = self._client.create_producer(
                self.topic,
                access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing,
                **producer_options(self._settings),
            )
        except pulsar.PulsarException as exc:
            raise client.translate(exc, f"taking {self.topic}", self._settings) from None

    def held(self) -> bool:
        return self._producer is not None

    def send(self, records: Sequence[bytes], stamp: PulsarStamp) -> list[PulsarMessageID]:
        """Send ``records`` pipelined; a prefix of them may be stored when it fails."""
        return self._send(records, properties(stamp))

    def stored(
        self, after: PulsarMessageID | None, until: PulsarMessageID
    ) -> Sequence[tuple[PulsarMessageID, PulsarStamp]]:
        return client.read_stamps(self._client, self._settings, self.topic, after, until)

    def _send(self, batch: Sequence[bytes], props: dict[str, str]) -> list[PulsarMessageID]:
        producer = self._producer
        sends = _Sends(len(batch))
        try:
            done = sends.done
            for data in batch:
                producer.send_async(data, done, properties=props)
        except pulsar.PulsarException as exc:
            self.drop()
            if isinstance(exc, pulsar.ProducerFenced | pulsar.AlreadyClosed):
                raise Lost(list(sends.ids)) from None
            raise client.translate(exc, f"appending to {self.topic}", self._settings) from None
        if not sends.wait(
            self._settings.send_timeout_ms / 1000 + self._settings.operation_timeout_s
        ):
            self.drop()
            raise errors.Unavailable(
                f"pulsar: sends to {self.topic} were not answered in time "
                f"({self._settings.service_url}); none of this append was acknowledged"
            )
        if sends.failure is None:
            return sends.ids
        first = sends.failure
        if first == pulsar.Result.MessageTooBig:
            largest = max(map(len, batch))
            raise errors.MessageTooLarge(
                f"pulsar: a record ({largest} bytes at most) is larger than {self.topic} "
                f"accepts ({self._settings.service_url}); it was not written"
                + ("" if len(batch) == 1 else ", the other records of the call may have been")
            )
        self.drop()
        if first in (pulsar.Result.ProducerFenced, pulsar.Result.AlreadyClosed):
            raise Lost(list(sends.ids))
        raise errors.Unavailable(
            f"pulsar: appending to {self.topic} failed with {first} "
            f"({self._settings.service_url}); a prefix of the records may have been written"
        )

    def drop(self) -> None:
        producer, self._producer = self._producer, None
        client.close_quietly(producer, f"a lost producer of {self.topic}")

    def release(self) -> None:
        self.drop()
        client.close_quietly(self._client, f"the client of {self.topic}")
