"""The Headrace client library.

:class:`HeadraceClient` discovers a cluster from its metastore and follows
owner changes; it makes :class:`Producer` and :class:`Consumer` objects and
:class:`ManagerClient` s. :mod:`headrace.client.sync` wraps it for blocking
code; :func:`status` summarises a cluster for ``headrace status``.
"""

from headrace.client.client import ClientOptions, HeadraceClient
from headrace.client.consumer import Consumer, ConsumerOptions
from headrace.client.discovery import Owner
from headrace.client.manager import ManagerClient, NodeWALs, WALStatus
from headrace.client.producer import Producer, ProducerOptions
from headrace.client.reading import ReadOptions
from headrace.client.status import status

__all__ = [
    "ClientOptions",
    "Consumer",
    "ConsumerOptions",
    "HeadraceClient",
    "ManagerClient",
    "NodeWALs",
    "Owner",
    "Producer",
    "ProducerOptions",
    "ReadOptions",
    "WALStatus",
    "status",
]
