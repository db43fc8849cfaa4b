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
the next one (group commit); each call's records stay consecutive.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import secrets
from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from headrace import errors
from headrace.message.ids import MessageID
from headrace.wal.contract import BackendWriter
from headrace.wal.kafka import client
from headrace.wal.kafka.fencing import Headers, Kind, Stamp, fence_check
from headrace.wal.kafka.message_id import KafkaMessageID
from headrace.wal.kafka.settings import KafkaSettings

_MAX_REACQUIRE = 3
_GROUP_MAX_RECORDS = 10_000
_GROUP_MAX_BYTES = 16 * 1024 * 1024


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
        self._pending: list[tuple[list[bytes], asyncio.Future[list[MessageID]]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._fenced: errors.Fenced | None = None
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
            producer = Producer(
                client.client_config_with_logger(self._settings.producer_config(self._topic))
            )
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
        if self._closed:
            raise errors.Closed(f"kafka writer of {self.pchannel} (term {self.term}) is closed")
        if self._fenced is not None:
            raise self._fenced
        batch = [bytes(r) for r in records]
        if not batch:
            return []
        future: asyncio.Future[list[MessageID]] = asyncio.get_running_loop().create_future()
        self._pending.append((batch, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_loop())
        return await future

    def _take_group(self) -> list[tuple[list[bytes], asyncio.Future[list[MessageID]]]]:
        group: list[tuple[list[bytes], asyncio.Future[list[MessageID]]]] = []
        count = size = 0
        while self._pending:
            batch = self._pending[0][0]
            if group and (
                count + len(batch) > _GROUP_MAX_RECORDS
                or size + sum(map(len, batch)) > _GROUP_MAX_BYTES
            ):
                break
            group.append(self._pending.pop(0))
            count += len(batch)
            size += sum(map(len, batch))
        return group

    async def _flush_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            group = self._take_group()
            flat = [record for batch, _ in group for record in batch]
            try:
                offsets = await loop.run_in_executor(self._executor, self._commit, flat)
            except errors.HeadraceError as exc:
                if isinstance(exc, errors.Fenced):
                    self._fenced = exc
                for _, future in group:
                    if not future.done():
                        future.set_exception(exc)
                continue
            index = 0
            for batch, future in group:
                ids: list[MessageID] = [
                    KafkaMessageID(o) for o in offsets[index : index + len(batch)]
                ]
                index += len(batch)
                if not future.done():
                    future.set_result(ids)

    def _commit(self, batch: list[bytes]) -> list[int]:
        """One transaction with ``batch``; reacquires the epoch if a lower term took it."""
        if self._fenced is not None:
            raise self._fenced
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
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._release)
        self._executor.shutdown(wait=False)

    def _release(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(self._settings.operation_timeout_s)
