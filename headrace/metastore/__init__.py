"""The metastore: etcd's model (revisions, leases, transactions, watches).

The contract lives in :mod:`headrace.metastore.contract` and is re-exported
here. Implementations: :mod:`~headrace.metastore.sqlite` (one shared file, the
embedded default) and :mod:`~headrace.metastore.etcd`; open either from a URL
with :func:`headrace.metastore.factory.open_metastore`. Liveness helpers
(sessions, elections) are in :mod:`~headrace.metastore.session`.
"""

from headrace.metastore.contract import (
    Compare,
    CompareOp,
    Delete,
    EventType,
    Get,
    KeyValue,
    LeaseExpired,
    Metastore,
    Op,
    Put,
    Target,
    TxnResult,
    Watch,
    WatchEvent,
)

__all__ = [
    "Compare",
    "CompareOp",
    "Delete",
    "EventType",
    "Get",
    "KeyValue",
    "LeaseExpired",
    "Metastore",
    "Op",
    "Put",
    "Target",
    "TxnResult",
    "Watch",
    "WatchEvent",
]
