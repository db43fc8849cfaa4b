"""Client of a node's Manager service: open, close and list its WALs."""

from __future__ import annotations

import dataclasses

import grpc

from headrace.client.errors import from_rpc_error
from headrace.proto import rpc
from headrace.proto import streaming_pb2 as pb


@dataclasses.dataclass(frozen=True, slots=True)
class WALStatus:
    pchannel: str
    term: int
    state: str
    last_id: str
    last_timetick: int
    stats: dict[str, str]

    @classmethod
    def from_proto(cls, info: pb.WALInfo) -> WALStatus:
        return cls(
            info.pchannel,
            info.term,
            info.state,
            info.last_id,
            info.last_timetick,
            dict(info.stats),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class NodeWALs:
    node_id: str
    wals: list[WALStatus]

    def find(self, pchannel: str) -> WALStatus | None:
        return next((w for w in self.wals if w.pchannel == pchannel), None)


class ManagerClient:
    """Calls one node's Manager service; errors are :mod:`headrace.errors` types."""

    def __init__(
        self, address: str, channel: grpc.aio.Channel | None = None, *, timeout: float = 10.0
    ) -> None:
        self.address = address
        self.timeout = timeout
        self._owns_channel = channel is None
        self._channel = channel if channel is not None else grpc.aio.insecure_channel(address)
        self._stub = rpc.manager_stub(self._channel)

    async def open_wal(
        self,
        pchannel: str,
        term: int,
        *,
        timeout: float | None = None,
    ) -> WALStatus:
        """Open ``pchannel`` on the node under ``term``, which must be what its
        assignment record says: the record must name this node (else NOT_OWNER)
        at this very term (FENCED below it, INVALID_ARGUMENT above it)."""
        try:
            response = await self._stub.OpenWAL(
                pb.OpenWALRequest(pchannel=pchannel, term=term), timeout=timeout or self.timeout
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.address) from None
        return WALStatus.from_proto(response.wal)

    async def close_wal(
        self,
        pchannel: str,
        term: int,
        *,
        timeout: float | None = None,
    ) -> None:
        """Drain and close ``pchannel``'s WAL of ``term`` on the node. Refused
        (INVALID_ARGUMENT, FENCED) while the assignment record says the node
        serves it: a pchannel leaves a node through the coordinator."""
        try:
            await self._stub.CloseWAL(
                pb.CloseWALRequest(pchannel=pchannel, term=term), timeout=timeout or self.timeout
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.address) from None

    async def list_wals(
        self,
        *,
        timeout: float | None = None,
    ) -> NodeWALs:
        try:
            response = await self._stub.ListWALs(
                pb.ListWALsRequest(), timeout=timeout or self.timeout
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.address) from None
        return NodeWALs(response.node_id, [WALStatus.from_proto(w) for w in response.wals])

    async def close(self) -> None:
        if self._owns_channel:
            await self._channel.close(None)
