"""A blocking facade over :class:`HeadraceClient` for code without asyncio.

:class:`SyncClient` runs an event loop in a daemon thread and forwards calls
to it::

    with SyncClient("sqlite:///var/headrace/meta.db") as client:
        result = client.produce("collection-1", b"row")
        for entry in client.consume("collection-1", max_messages=10, idle_timeout=1.0):
            ...
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import (
    AsyncGenerator,
    Collection,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any, TypeVar

import pyarrow as pa

from headrace import errors
from headrace.client import arguments
from headrace.client.arguments import Start
from headrace.client.client import ClientOptions, HeadraceClient
from headrace.client.compacting import CompactOutcome
from headrace.client.consumer import Consumer, ConsumerOptions
from headrace.client.discovery import Owner
from headrace.client.flushing import FlushOutcome
from headrace.client.producer import Producer, ProducerOptions, WriteResult
from headrace.client.reading import AsOf, ReadOptions
from headrace.cluster import DEFAULT_CLUSTER
from headrace.message.types import LogEntry, Message, MessageType
from headrace.table.collections import Collection as TableCollection
from headrace.table.payloads import Keys, Rows
from headrace.wal.api import AppendResult

T = TypeVar("T")


class SyncClient:
    """Blocking produce/consume helpers; close it (or use ``with``) when done."""

    def __init__(
        self,
        metastore_url: str,
        cluster: str = DEFAULT_CLUSTER,
        *,
        options: ClientOptions | None = None,
        producer_options: ProducerOptions | None = None,
    ) -> None:
        # Bad arguments raise here, before a thread is started.
        self._client = HeadraceClient(metastore_url, cluster, options=options)
        self._producer_options = (
            None
            if producer_options is None
            else arguments.instance(producer_options, ProducerOptions, "producer_options")
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="headrace-sync-client", daemon=True
        )
        self._thread.start()
        self._producer: Producer | None = None
        try:
            self._run(self._client.connect())
        except BaseException:
            self._stop_loop()
            raise

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self._loop.is_closed():
            coro.close()
            raise errors.Closed("the client is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise errors.Unavailable(f"no answer within {timeout:g}s") from None

    async def _get_producer(self) -> Producer:
        if self._producer is None:
            self._producer = self._client.producer(self._producer_options)
        return self._producer

    def produce(
        self,
        vchannel: str,
        payload: bytes,
        *,
        type: MessageType = MessageType.INSERT,
        properties: Mapping[str, str] | None = None,
    ) -> AppendResult:
        """Append one message and wait for its acknowledgement."""

        async def send() -> AppendResult:
            producer = await self._get_producer()
            return await producer.send(vchannel, payload, type=type, properties=properties)

        return self._run(send())

    def produce_many(
        self, messages: Iterable[Message]
    ) -> list[AppendResult | errors.HeadraceError]:
        """Append messages; one result or error per message."""
        batch = arguments.messages(messages)

        async def send() -> list[AppendResult | errors.HeadraceError]:
            producer = await self._get_producer()
            return await producer.send_many(batch)

        return self._run(send())

    def create_collection(
        self, name: str, schema: pa.Schema, primary_key: str = "pk", shards: int = 1
    ) -> TableCollection:
        """See :meth:`HeadraceClient.create_collection`."""
        return self._run(self._client.create_collection(name, schema, primary_key, shards))

    def describe_collection(self, name: str) -> TableCollection:
        return self._run(self._client.describe_collection(name))

    def list_collections(self, *, include_dropped: bool = False) -> list[TableCollection]:
        return self._run(self._client.list_collections(include_dropped=include_dropped))

    def drop_collection(self, name: str) -> TableCollection:
        """See :meth:`HeadraceClient.drop_collection`."""
        return self._run(self._client.drop_collection(name))

    def insert(self, collection: str, rows: Rows) -> WriteResult:
        """See :meth:`Producer.insert`."""

        async def send() -> WriteResult:
            producer = await self._get_producer()
            return await producer.insert(collection, rows)

        return self._run(send())

    def delete(self, collection: str, keys: Keys) -> WriteResult:
        """See :meth:`Producer.delete`."""

        async def send() -> WriteResult:
            producer = await self._get_producer()
            return await producer.delete(collection, keys)

        return self._run(send())

    def flush(
        self, collection: str, *, wait: bool = True, timeout: float | None = 300.0
    ) -> FlushOutcome:
        """See :meth:`HeadraceClient.flush` (its own timeout bounds the wait)."""
        return self._run(self._client.flush(collection, wait=wait, timeout=timeout))

    def read(
        self,
        collection: str,
        *,
        as_of: AsOf = "latest",
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        options: ReadOptions | None = None,
    ) -> pa.Table:
        """See :meth:`HeadraceClient.read`."""
        return self._run(
            self._client.read(
                collection, as_of=as_of, columns=columns, filter=filter, options=options
            )
        )

    def read_batches(
        self,
        collection: str,
        *,
        as_of: AsOf = "latest",
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        options: ReadOptions | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """See :meth:`HeadraceClient.read_batches`: the snapshot stays pinned
        until the iteration ends or the iterator is closed."""
        batches = self._client.read_batches(
            collection, as_of=as_of, columns=columns, filter=filter, options=options
        )
        try:
            while True:
                batch = self._run(_next_or_none(batches))
                if batch is None:
                    return
                yield batch
        finally:
            if not self._loop.is_closed():
                self._run(batches.aclose())

    def compact(
        self, collection: str, *, wait: bool = True, timeout: float | None = 300.0
    ) -> CompactOutcome:
        """See :meth:`HeadraceClient.compact` (its own timeout bounds the wait)."""
        return self._run(self._client.compact(collection, wait=wait, timeout=timeout))

    def wait_ready(self, pchannel: str, timeout: float = 30.0) -> Owner:
        return self._run(self._client.wait_ready(pchannel, timeout))

    def route(self, vchannel: str) -> str:
        return self._client.route(vchannel)

    def consume(
        self,
        vchannel: str,
        *,
        start: Start = "earliest",
        types: Collection[MessageType] | None = None,
        max_messages: int | None = None,
        idle_timeout: float | None = None,
        options: ConsumerOptions | None = None,
    ) -> Iterator[LogEntry]:
        """Yield ``vchannel``'s messages until ``max_messages`` were yielded or
        none arrived for ``idle_timeout`` seconds (None: no limit)."""
        limit = arguments.count(max_messages, "max_messages")
        idle = arguments.timeout(idle_timeout)

        async def open_consumer() -> Consumer:
            return self._client.consume(vchannel, start, types, options)

        consumer = self._run(open_consumer())
        count = 0
        try:
            while limit is None or count < limit:
                entry = self._run(consumer.next(idle))
                if entry is None:
                    return
                count += 1
                yield entry
        finally:
            if not self._loop.is_closed():
                self._run(consumer.close())

    def close(self) -> None:
        if self._loop.is_closed():
            return

        async def shutdown() -> None:
            try:
                if self._producer is not None:
                    await self._producer.close()
            finally:
                await self._client.close()

        try:
            self._run(shutdown())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


async def _next_or_none(batches: AsyncGenerator[pa.RecordBatch, None]) -> pa.RecordBatch | None:
    return await anext(batches, None)
