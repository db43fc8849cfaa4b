"""The asynchronous client of a Headrace cluster."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import AsyncGenerator, Sequence
from collections.abc import Collection as Container

import pyarrow as pa

from headrace import errors
from headrace.client import arguments
from headrace.client.arguments import Start
from headrace.client.compacting import CompactOutcome, request_compaction, wait_compacted
from headrace.client.consumer import Consumer, ConsumerOptions
from headrace.client.discovery import ChannelPool, ClusterView, Owner
from headrace.client.flushing import FlushOutcome, WaitOptions, wait_flushed
from headrace.client.manager import ManagerClient
from headrace.client.producer import Producer, ProducerOptions
from headrace.client.reading import AsOf, ReadOptions, ReadRequest, SnapshotRead
from headrace.client.session import Session
from headrace.cluster import DEFAULT_CLUSTER, Keys
from headrace.message.ids import MessageID
from headrace.message.types import Message, MessageType
from headrace.metastore.contract import Metastore
from headrace.metastore.factory import open_metastore
from headrace.table import messages as table_messages
from headrace.table.collections import Collection, CollectionSpec, CollectionStore, Dropped
from headrace.table.records import TableRecord, table_key
from headrace.tls import ClientTLS
from headrace.wal import registry
from headrace.wal.api import AppendResult


@dataclasses.dataclass(frozen=True, slots=True)
class ClientOptions:
    connect_timeout: float = 10.0
    """Seconds to open the metastore and read the cluster state."""
    probe_timeout: float = 2.0
    """Seconds a node gets to answer the readiness probe of :meth:`HeadraceClient.wait_ready`."""
    max_message_bytes: int = 64 * 1024 * 1024
    """Largest gRPC message sent or received."""
    tls: ClientTLS | None = dataclasses.field(default_factory=ClientTLS.from_env)
    """CA (and client certificate, bearer token file) for nodes that serve TLS;
    by default from ``HEADRACE_TLS_CA``, ``_CERT``, ``_KEY`` and ``HEADRACE_TOKEN_FILE``."""


class HeadraceClient:
    """Discovers a cluster in its metastore and talks to its nodes.

    Use as ``async with HeadraceClient(url) as client:`` or call
    :meth:`connect` and :meth:`close`.
    """

    def __init__(
        self,
        metastore_url: str,
        cluster: str = DEFAULT_CLUSTER,
        *,
        metastore: Metastore | None = None,
        options: ClientOptions | None = None,
    ) -> None:
        self.metastore_url = arguments.instance(metastore_url, str, "metastore_url")
        self.keys = Keys(arguments.instance(cluster, str, "cluster"))
        self.options = arguments.instance(options or ClientOptions(), ClientOptions, "options")
        self._metastore = metastore
        self._owns_metastore = metastore is None
        self._session: Session | None = None
        self.channels = ChannelPool(self.options.max_message_bytes, self.options.tls)
        registry.load_id_classes()

    async def __aenter__(self) -> HeadraceClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> HeadraceClient:
        """Open the metastore and start following the cluster; Unavailable if unreachable."""
        if self._session is not None:
            return self
        try:
            async with asyncio.timeout(self.options.connect_timeout):
                if self._metastore is None:
                    self._metastore = await open_metastore(self.metastore_url, create=False)
                view = ClusterView(self._metastore, self.keys)
                await view.start()
        except TimeoutError:
            await self._close_metastore()
            raise errors.Unavailable(
                f"metastore {self.metastore_url} did not answer within "
                f"{self.options.connect_timeout:g}s"
            ) from None
        except errors.HeadraceError:
            await self._close_metastore()
            raise
        self.channels.tls_mode = view.tls_mode
        self._session = Session(view, self.channels)
        return self

    async def _close_metastore(self) -> None:
        if self._owns_metastore and self._metastore is not None:
            metastore, self._metastore = self._metastore, None
            await metastore.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.view.close()
            self._session = None
        await self.channels.close()
        await self._close_metastore()

    @property
    def session(self) -> Session:
        """What producers and consumers use; Closed if the client is not connected."""
        if self._session is None:
            raise errors.Closed("the client is not connected; call connect() first")
        return self._session

    @property
    def view(self) -> ClusterView:
        return self.session.view

    def route(self, vchannel: str) -> str:
        """The pchannel carrying ``vchannel`` (Unavailable before the config is known)."""
        return self.view.route(arguments.vchannel(vchannel))

    async def wait_ready(self, pchannel: str, timeout: float = 30.0) -> Owner:
        """Wait until ``pchannel`` is ASSIGNED and its node says it serves it."""
        pchannel = arguments.pchannel(pchannel)
        limit = arguments.timeout(timeout)
        deadline = time.monotonic() + (math.inf if limit is None else limit)
        view = self.view
        avoid: Owner | None = None
        while True:
            if avoid is not None:
                try:
                    owner = await view.wait_owner(
                        pchannel, min(deadline, time.monotonic() + 0.2), avoid=avoid
                    )
                except errors.Unavailable:
                    owner = await view.wait_owner(pchannel, deadline)
            else:
                owner = await view.wait_owner(pchannel, deadline)
            if await self._serves(owner):
                return owner
            if time.monotonic() >= deadline:
                raise errors.Unavailable(f"{pchannel} did not become ready within {timeout:g}s")
            avoid = owner

    async def _serves(self, owner: Owner) -> bool:
        manager = ManagerClient(owner.address, self.channels.get(owner.address))
        try:
            wals = await manager.list_wals(timeout=self.options.probe_timeout)
        except errors.HeadraceError:
            return False
        status = wals.find(owner.pchannel)
        return status is not None and status.term == owner.term and status.state == "SERVING"

    def manager(self, address: str) -> ManagerClient:
        """A Manager client for the node at ``address``, over the shared channel."""
        return ManagerClient(address, self.channels.get(address))

    def producer(self, options: ProducerOptions | None = None) -> Producer:
        return Producer(self.session, options or ProducerOptions())

    def consume(
        self,
        vchannel: str,
        start: Start = "earliest",
        types: Container[MessageType] | None = None,
        options: ConsumerOptions | None = None,
    ) -> Consumer:
        """Iterate over ``vchannel``'s messages from ``start``.

        ``start``: "earliest", "latest", or a MessageID to start at (inclusive).
        ``types``: the message types to deliver; None delivers every type but
        the WAL's own time ticks and fences.
        """
        return Consumer(self.session, vchannel, start, types, options or ConsumerOptions())

    # -- collections ----------------------------------------------------------

    @property
    def collections(self) -> CollectionStore:
        """The cluster's collection records (Closed if the client is not connected)."""
        view = self.view
        return CollectionStore(view.metastore, view.keys)

    async def create_collection(
        self, name: str, schema: pa.Schema, primary_key: str = "pk", shards: int = 1
    ) -> Collection:
        """Record a collection and announce it on each shard; the recorded collection.

        Idempotent: the same definition again returns the same collection (and
        appends its CREATE_COLLECTION again, which readers take as a no-op).
        CONFLICT if the name holds another definition or was dropped;
        INVALID_ARGUMENT for a bad definition (see ``CollectionSpec``).
        """
        if not isinstance(schema, pa.Schema):
            raise errors.InvalidArgument(
                f"schema must be a pyarrow Schema, got a {type(schema).__name__}"
            )
        spec = CollectionSpec(
            arguments.instance(name, str, "name"),
            schema,
            arguments.instance(primary_key, str, "primary_key"),
            arguments.instance(shards, int, "shards"),
        )
        collection = await self.collections.create(spec)
        await self._append_all(
            [table_messages.create_collection(collection, v) for v in collection.vchannels]
        )
        return collection

    async def describe_collection(self, name: str) -> Collection:
        """The recorded collection (dropped ones too); NOT_FOUND if there is none."""
        return await self.collections.get(arguments.instance(name, str, "name"))

    async def table_location(self, name: str) -> str | None:
        """The current metadata file of ``name``'s Iceberg table, which any
        Iceberg reader opens (DuckDB's ``iceberg_scan``, Spark, Trino); None
        before its first flush."""
        view = self.view
        kv = await view.metastore.get(table_key(view.keys, arguments.instance(name, str, "name")))
        return None if kv is None else TableRecord.from_json(kv.value).metadata_location

    async def list_collections(self, *, include_dropped: bool = False) -> list[Collection]:
        """The cluster's collections by name (dropped ones only if asked)."""
        found = await self.collections.list()
        return [c for c in found if include_dropped or c.dropped is None]

    async def drop_collection(self, name: str) -> Collection:
        """Append DROP_COLLECTION to each shard, then mark the record dropped.

        Flushing of the collection stops and its table's data is garbage; its
        name is never reused. Idempotent: a dropped collection is returned as
        it is. NOT_FOUND if there is no such collection.
        """
        collection = await self.describe_collection(name)
        if collection.dropped is not None:
            return collection
        results = await self._append_all(
            [table_messages.drop_collection(collection, v) for v in collection.vchannels]
        )
        timetick = max(r.timetick for r in results)
        return await self.collections.drop(collection.name, Dropped(time.time(), timetick))

    async def flush(
        self, collection: str, *, wait: bool = True, timeout: float | None = 300.0
    ) -> FlushOutcome:
        """Ask every shard's owner to seal the collection's growing segments.

        With ``wait``, return once every involved pchannel's checkpoint is at
        or past its acknowledged request (the rows written before the call are
        in the table), or raise Unavailable after ``timeout`` seconds naming
        the pchannels still behind and their checkpoints.
        """
        target = await self.describe_collection(collection)
        if target.dropped is not None:
            raise errors.NotFound(f"collection {target.name} was dropped")
        limit = arguments.timeout(timeout)
        results = await self._append_all(
            [table_messages.flush_request(target, v) for v in target.vchannels]
        )
        targets: dict[str, MessageID] = {}
        for vchannel, result in zip(target.vchannels, results, strict=True):
            pchannel = self.route(vchannel)
            known = targets.get(pchannel)
            targets[pchannel] = result.id if known is None or known < result.id else known
        if not wait:
            return FlushOutcome(target.name, targets, {}, waited=False)
        view = self.view
        checkpoints = await wait_flushed(
            view.metastore, view.keys, target.name, targets, WaitOptions(timeout=limit)
        )
        return FlushOutcome(target.name, targets, checkpoints, waited=True)

    # -- snapshot reads ---------------------------------------------------------

    def snapshot_read(
        self,
        collection: str,
        *,
        as_of: AsOf = "latest",
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        options: ReadOptions | None = None,
    ) -> SnapshotRead:
        """An open read to use as ``async with``: its plan (``planned``) and
        its rows (``table()`` or ``batches()``); the snapshot stays pinned
        until it ends. See :meth:`read`."""
        request = ReadRequest(
            arguments.instance(collection, str, "collection"),
            _as_of(as_of),
            _column_names(columns),
            _filter_text(filter),
        )
        opts = arguments.instance(options or ReadOptions(), ReadOptions, "options")
        return SnapshotRead(self.session, request, opts)

    async def read(
        self,
        collection: str,
        *,
        as_of: AsOf = "latest",
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        options: ReadOptions | None = None,
    ) -> pa.Table:
        """The collection as of timetick ``as_of`` ("latest": everything
        acknowledged before the call) as a pyarrow Table.

        The committed Iceberg table at the snapshot whose checkpoints are the
        newest at or before ``as_of``, plus the WAL's inserts after them up to
        ``as_of``, deletes up to ``as_of`` applied, each primary key once (the
        latest version wins). ``columns``: field names (default all);
        ``filter``: an Iceberg row-filter string such as ``"pk > 10 and name =
        'x'"`` (INVALID_ARGUMENT naming the problem otherwise). Needs the
        ``pipeline`` extra (pyiceberg) once the collection has a table.
        """
        async with self.snapshot_read(
            collection, as_of=as_of, columns=columns, filter=filter, options=options
        ) as reading:
            return await reading.table()

    async def read_batches(
        self,
        collection: str,
        *,
        as_of: AsOf = "latest",
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        options: ReadOptions | None = None,
    ) -> AsyncGenerator[pa.RecordBatch, None]:
        """:meth:`read` as record batches, for results larger than memory: the
        snapshot stays pinned until the iteration ends (or is closed)."""
        async with self.snapshot_read(
            collection, as_of=as_of, columns=columns, filter=filter, options=options
        ) as reading:
            async for part in reading.batches():
                for batch in part.to_batches():
                    yield batch

    async def compact(
        self, collection: str, *, wait: bool = True, timeout: float | None = 300.0
    ) -> CompactOutcome:
        """Ask the flush runner to compact every shard of ``collection`` now.

        With ``wait``, return once the runner found nothing left to compact
        (its small files merged, in bounded steps), or raise Unavailable with
        the runner's error or after ``timeout`` seconds.
        """
        target = await self.describe_collection(collection)
        if target.dropped is not None:
            raise errors.NotFound(f"collection {target.name} was dropped")
        limit = arguments.timeout(timeout)
        view = self.view
        request = await request_compaction(view.metastore, view.keys, target.name)
        if not wait:
            return CompactOutcome(
                target.name, request.request_id, request.state, request.message, waited=False
            )
        done = await wait_compacted(view.metastore, view.keys, request, limit)
        return CompactOutcome(target.name, done.request_id, done.state, done.message, waited=True)

    async def _append_all(self, batch: list[Message]) -> list[AppendResult]:
        """Append ``batch`` with a producer of its own; the first error if any failed."""
        async with self.producer() as producer:
            outcomes = await producer.send_many(batch)
        for outcome in outcomes:
            if isinstance(outcome, errors.HeadraceError):
                raise outcome
        return [o for o in outcomes if isinstance(o, AppendResult)]


def _as_of(as_of: object) -> AsOf:
    if as_of == "latest":
        return "latest"
    if isinstance(as_of, bool) or not isinstance(as_of, int) or as_of < 0:
        raise errors.InvalidArgument(
            f'as_of must be a timetick (an int >= 0) or "latest", got {as_of!r}'
        )
    return as_of


def _column_names(columns: object) -> tuple[str, ...] | None:
    if columns is None:
        return None
    if isinstance(columns, str) or not isinstance(columns, Sequence):
        raise errors.InvalidArgument(
            f"columns must be a list of field names, got {type(columns).__name__} {columns!r}"
        )
    names = tuple(columns)
    if not all(isinstance(n, str) for n in names):
        raise errors.InvalidArgument(f"columns must be field names (strings), got {names!r}")
    return names


def _filter_text(text: object) -> str | None:
    if text is None or isinstance(text, str):
        return text
    raise errors.InvalidArgument(
        f'filter must be an Iceberg row-filter string such as "pk > 10", got a '
        f"{type(text).__name__}"
    )
