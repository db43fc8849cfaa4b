"""The edges the reconcile steps talk to, as protocols.

:mod:`.steps` depends only on these; the real implementations are
:class:`.kube.KubernetesApi` (the API server), :class:`.coordinator_runner.MetastoreControl`
(the metastore and the coordinator's requests), :class:`.events.KubeEventSink`
and :class:`.probe.TcpProbe`. The tests drive the same steps through an
in-memory API server fake and through the real API server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from headrace.client.flushing import FlushRequested
from headrace.coordinator.formats import FormatSwitch
from headrace.coordinator.snapshot import ClusterSnapshot
from headrace.coordinator.writestop import StopState
from headrace.table.records import CheckpointRecord
from headrace_operator.models import StreamingClusterSpec
from spark_apps.schedule import Channel, Unreadable

Object = dict[str, Any]


class KubeApi(Protocol):
    """Get, list, apply and delete Kubernetes objects.

    Errors are :mod:`headrace_operator.errors` types; a missing object is
    ``None`` (get) or ``False`` (delete), never an error.
    """

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Object | None:
        """The object, or None when it does not exist."""

    async def list(
        self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str]
    ) -> list[Object]:
        """Objects of ``kind`` in ``namespace`` carrying all of ``labels``."""

    async def apply(self, obj: Mapping[str, Any]) -> Object:
        """Server-side apply ``obj`` as the operator's field manager (forced)."""

    async def patch_merge(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        *,
        subresource: str = "",
    ) -> Object:
        """JSON merge patch (``subresource="status"`` for the status)."""

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Delete (background propagation); False when it did not exist."""

    async def create(self, obj: Mapping[str, Any]) -> Object:
        """Create (``metadata.generateName`` allowed), e.g. an Event."""

    async def served(self, api_version: str, kind: str) -> bool:
        """Whether the API server serves ``kind`` in ``api_version`` (discovery)."""


class ClusterControl(Protocol):
    """A cluster's coordination state in the metastore, and requests to its
    coordinator (:class:`headrace.coordinator.ClusterAdmin`)."""

    async def snapshot(self) -> ClusterSnapshot: ...

    async def leader(self) -> str:
        """Id of the leading coordinator ("" if none)."""

    async def drain(self, node: str) -> None: ...

    async def undrain(self, node: str) -> None: ...

    async def move(self, pchannel: str, node: str) -> None: ...

    async def set_format(self, version: int, reason: str) -> FormatSwitch:
        """Switch the cluster's message format (refused, InvalidArgument, unless
        every registered node reads and writes it)."""

    async def freeze(self, node: str) -> None:
        """Freeze ``node``: it receives no new pchannels, keeps what it holds."""

    async def write_stop(self) -> StopState:
        """The cluster-wide write stop and the nodes' acks."""

    async def stop_writes(self, reason: str, by: str) -> StopState:
        """Stop writes cluster-wide (an earlier stop is kept as it was)."""

    async def resume_writes(self) -> bool:
        """Let writes flow again; whether they were stopped."""

    async def flush_channels(self) -> Sequence[Channel | Unreadable]:
        """Per pchannel with a seal: its seal, checkpoint and Assignment."""

    async def request_flush(self) -> FlushRequested:
        """Ask every shard owner of every live collection for a flush (flush
        requests pass a write stop); per pchannel the latest request acknowledged."""

    async def checkpoints(self, pchannels: Sequence[str]) -> Mapping[str, CheckpointRecord | None]:
        """The pchannels' flush checkpoints, read at one revision."""

    def coordinator_error(self) -> str:
        """Why the in-process coordinator cannot run ("" when it can)."""

    def candidate_id(self) -> str:
        """The id this process's coordinator campaigns under ("" if none)."""


class EventSink(Protocol):
    async def emit(
        self, involved: Mapping[str, Any], reason: str, message: str, *, warning: bool = False
    ) -> None:
        """Record a Kubernetes Event about ``involved`` (never raises)."""


class BackendProbe(Protocol):
    async def check(self, spec: StreamingClusterSpec) -> Sequence[str]:
        """Problems reaching the metastore and the WAL backend (empty: fine)."""
