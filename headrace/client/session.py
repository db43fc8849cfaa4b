"""What producers and consumers use of a connected client."""

from __future__ import annotations

import dataclasses

from headrace.client.discovery import ChannelPool, ClusterView


@dataclasses.dataclass(frozen=True, slots=True)
class Session:
    """A connected client's live cluster view and its gRPC channels to the nodes.

    Once the client closes, waits on the view raise
    :class:`headrace.errors.Closed`.
    """

    view: ClusterView
    channels: ChannelPool
