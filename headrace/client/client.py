"""The asynchronous client of a Headrace cluster."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Collection

from headrace import errors
from headrace.client import arguments
from headrace.client.arguments import Start
from headrace.client.consumer import Consumer, ConsumerOptions
from headrace.client.discovery import ChannelPool, ClusterView, Owner
from headrace.client.manager import ManagerClient
from headrace.client.producer import Producer, ProducerOptions
from headrace.client.session import Session
from headrace.cluster import DEFAULT_CLUSTER, Keys
from headrace.message.types import MessageType
from headrace.metastore.contract import Metastore
from headrace.metastore.factory import open_metastore
from headrace.wal import registry


@dataclasses.dataclass(frozen=True, slots=True)
class ClientOptions:
    connect_timeout: float = 10.0
    """Seconds to open the metastore and read the cluster state."""
    probe_timeout: float = 2.0
    """Seconds a node gets to answer the readiness probe of :meth:`HeadraceClient.wait_ready`."""
    max_message_bytes: int = 64 * 1024 * 1024
    """Largest gRPC message sent or received."""


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
        self.channels = ChannelPool(self.options.max_message_bytes)
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
        types: Collection[MessageType] | None = None,
        options: ConsumerOptions | None = None,
    ) -> Consumer:
        """Iterate over ``vchannel``'s messages from ``start``.

        ``start``: "earliest", "latest", or a MessageID to start at (inclusive).
        ``types``: the message types to deliver; None delivers every type but
        the WAL's own time ticks and fences.
        """
        return Consumer(self.session, vchannel, start, types, options or ConsumerOptions())
