"""The Kafka writer: a transactional producer, one transaction per group of appends.

Fencing is the broker's: the transactional id is derived from the topic, so
``init_transactions()`` by a new owner bumps the producer epoch and the old
producer's next transaction fails with ``_FENCED``; nothing of it becomes
visible to read_committed readers. The term rule sits on top (see
:mod:`headrace.wal.kafka.fencing`): before and after taking the epoch the
writer reads the topic's last record and refuses a lower term; then it writes a
fence record carrying its term. A writer that loses its epoch to a *lower*
term (a stale opener that then gave up) takes it back and retries, so the
highest term always wins.

Appends that arrive while a transaction is in flight are committed together in
the next one (group commit, :mod:`headrace.wal.groupcommit`); each call's
records stay consecutive. A call that finds the writer idle starts its
transaction at once in the writer's thread (``start_append``), and the next
queued group starts the moment a commit returns. librdkafka allows one open
transaction per producer, so transactions never overlap: what arrives during a
commit waits for it and then goes in one larger transaction.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from headrace import errors
from headrace.message.ids import MessageID
from headrace.wal.contract import BackendWriter
from headrace.wal.groupcommit import Future, GroupCommit, failed
from headrace.wal.kafka import client
from headrace.wal.kafka.fencing import Headers, Kind, Stamp, fence_check
from headrace.wal.kafka.message_id import KafkaMessageID
from headrace.wal.kafka.settings import KafkaSettings

_MAX_REACQUIRE = 3


def producer_config(settings: KafkaSettings, topic: str) -> dict[str, Any]:
    """The transactional producer's librdkafka configuration for ``topic``."""
    return client.client_config_with_logger(settings.producer_config(topic))


class _LostEpoch(Exception):
    """The producer was fenced by somebody; decide whether to take it back."""


class _Txn:
    """Delivery reports of one transaction, in produce order (one partition)."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.error: KafkaError | None = None

    def delivered(self, err: KafkaError | None, msg: Message) -> None:
        offset = msg.offset()
        if err is not None or offset is None:
            self.error = self.error or err
        else:
            self.offsets.append(offset)


class KafkaWriter(BackendWriter):
    def __init__(self, settings: KafkaSettings, pchannel: str, topic: str, term: int) -> None:
        self.pchannel = pchannel
        self.term = term
        self._settings = settings
        self._topic = topic
        self._nonce = secrets.randbits(64)
        self._data_header = Stamp(Kind.DATA, term, self._nonce).header()
        self._producer: Producer | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(1, f"kafka-writer-{pchannel}")
        self._group = GroupCommit(self._commit_ids, self._executor, what=f"kafka append to {topic}")
        self._closed = False

    # ---- opening ---------------------------------------------------------------------

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._acquire, False)
        except BaseException:
            await self.close()
            raise

    def _check(self, *, reacquire: bool) -> client.Tail | None:
        tail = client.read_tail(self._settings, self._topic)
        last = tail.last.stamp if tail is not None else None
        fenced = fence_check(self.pchannel, self.term, self._nonce, last, reacquire=reacquire)
        if fenced is not None:
            raise fenced
        return tail

    def _acquire(self, reacquire: bool) -> None:
        """Take the producer epoch and write the fence record (blocking)."""
        for _ in range(_MAX_REACQUIRE):
            self._check(reacquire=reacquire)
            producer = Producer(producer_config(self._settings, self._topic))
            try:
                producer.init_transactions(self._settings.operation_timeout_s)
            except KafkaException as exc:
                raise client.translate_exception(
                    exc, f"taking {self._topic}", self._settings
                ) from None
            tail = self._check(reacquire=reacquire)
            prev = tail.last_data if tail is not None else -1
            fence = Stamp(Kind.FENCE, self.term, self._nonce, prev).header()
            self._producer = producer
            try:
                self._transaction([b""], fence)
                return
            except _LostEpoch:
                self._producer = None
                reacquire = True
        raise errors.Unavailable(
            f"kafka: pchannel {self.pchannel} (topic {self._topic}) kept losing its producer "
            f"to other openers; gave up after {_MAX_REACQUIRE} attempts"
        )

    # ---- appending -------------------------------------------------------------------

    async def append(self, records: Sequence[bytes]) -> list[MessageID]:
        return await self.start_append(records)

    def start_append(
        self, records: Sequence[bytes], on_done: Callable[[Future], None] | None = None
    ) -> Future:
        """:meth:`append`, whose transaction starts now if none is in flight."""
        if self._closed:
            closed = f"kafka writer of {self.pchannel} (term {self.term}) is closed"
            return failed(errors.Closed(closed), on_done)
        return self._group.start([bytes(r) for r in records], on_done)

    def _commit_ids(self, batch: list[bytes]) -> list[KafkaMessageID]:
        return [KafkaMessageID(offset) for offset in self._commit(batch)]

    def _commit(self, batch: list[bytes]) -> list[int]:
        """One transaction with ``batch``; reacquires the epoch if a lower term took it."""
        if self._group.fenced is not None:
            raise self._group.fenced
        for _ in range(_MAX_REACQUIRE):
            if self._producer is None:
                self._acquire(True)
            try:
                return self._transaction(batch, self._data_header)
            except _LostEpoch:
                self._producer = None
        raise errors.Unavailable(
            f"kafka: pchannel {self.pchannel} (topic {self._topic}) kept losing its producer "
            f"to other openers; gave up after {_MAX_REACQUIRE} attempts"
        )

    def _transaction(self, batch: list[bytes], headers: Headers) -> list[int]:
        producer = self._producer
        assert producer is not None
        txn = _Txn()
        delivered = txn.delivered
        topic = self._topic
        timeout = self._settings.operation_timeout_s
        try:
            producer.begin_transaction()
            for data in batch:
                while True:
                    try:
                        producer.produce(
                            topic, data, partition=0, headers=headers, on_delivery=delivered
                        )
                        break
                    except BufferError:
                        producer.poll(0.05)
            producer.commit_transaction(timeout)
        except KafkaException as exc:
            raise self._failed(exc) from None
        if txn.error is not None or len(txn.offsets) != len(batch):
            detail = txn.error.str() if txn.error is not None else "missing delivery reports"
            self._producer = None
            raise errors.Unavailable(
                f"kafka: a transaction on {self._topic} committed without all delivery "
                f"reports ({detail}); the writer will start a new producer"
            )
        return txn.offsets

    def _failed(self, exc: KafkaException) -> Exception:
        """Map a failed transaction; abort it when the producer can go on."""
        err = client.kafka_error(exc)
        if client.is_fenced(err):
            return _LostEpoch()
        if err is not None and not err.fatal():
            try:
                assert self._producer is not None
                self._producer.abort_transaction(self._settings.operation_timeout_s)
            except KafkaException:
                self._producer = None
        else:
            self._producer = None
        return client.translate_exception(
            exc, f"appending to {self._topic} (nothing was acknowledged)", self._settings
        )

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
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(self._settings.operation_timeout_s)
