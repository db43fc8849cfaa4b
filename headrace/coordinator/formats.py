"""The cluster's message-format version and the formats of each log, in the metastore.

Two records (:mod:`headrace.cluster`): ``<root>/format`` (:class:`ClusterFormat`,
the format every node writes; absent: 1) and ``<root>/formats/<pchannel>``
(:class:`LogFormats`, the formats written in that pchannel's log; absent: 1).
The rules are the pure predicates of :mod:`headrace.message.formats`; this
module reads the records and carries out a switch.

A switch (:func:`set_cluster_format`) is refused unless every registered node
reads and writes the new format, and formats only move forward. It takes
effect on each pchannel at its next term: a node chooses the format when it
opens the WAL (:mod:`headrace.node.formats`), and one term writes one format.
"""

from __future__ import annotations

import dataclasses
import time

from headrace import errors
from headrace.cluster import ClusterFormat, Keys, LogFormats, NodeInfo
from headrace.message.formats import FormatSupport, switch_refusal
from headrace.metastore.contract import Compare, Metastore, Put


async def read_cluster_format(metastore: Metastore, keys: Keys) -> ClusterFormat:
    """The cluster's format record (the default, format 1, when absent)."""
    kv = await metastore.get(keys.format)
    return ClusterFormat() if kv is None else ClusterFormat.from_json(kv.value)


async def registered_formats(metastore: Metastore, keys: Keys) -> dict[str, FormatSupport]:
    """What each registered (live) node reads and writes."""
    nodes: dict[str, FormatSupport] = {}
    for kv in await metastore.get_prefix(keys.nodes):
        info = NodeInfo.from_json(kv.value)
        nodes[info.node_id] = info.formats
    return nodes


@dataclasses.dataclass(frozen=True, slots=True)
class FormatSwitch:
    """The outcome of :func:`set_cluster_format`."""

    previous: int
    version: int

    @property
    def changed(self) -> bool:
        return self.previous != self.version


async def set_cluster_format(
    metastore: Metastore, keys: Keys, version: int, *, reason: str
) -> FormatSwitch:
    """Switch the cluster's format to ``version``.

    InvalidArgument (saying why) unless every registered node reads and writes
    it and it is not below the current one; setting the current version again
    changes nothing. Conflict if another switch raced this one.
    """
    kv = await metastore.get(keys.format)
    current = ClusterFormat() if kv is None else ClusterFormat.from_json(kv.value)
    refusal = switch_refusal(await registered_formats(metastore, keys), current.version, version)
    if refusal:
        raise errors.InvalidArgument(
            f"cannot switch cluster {keys.cluster!r} to message format {version}: {refusal}"
        )
    if version == current.version:
        return FormatSwitch(current.version, version)
    record = ClusterFormat(
        version=version, previous=current.version, changed_at=time.time(), reason=reason
    )
    guard = (
        Compare.absent(keys.format)
        if kv is None
        else Compare.mod_revision_is(keys.format, kv.mod_revision)
    )
    result = await metastore.txn([guard], [Put(keys.format, record.to_json())])
    if not result.succeeded:
        raise errors.Conflict(
            f"the message format of cluster {keys.cluster!r} changed while switching it to "
            f"{version}; read it again",
            retryable=True,
        )
    return FormatSwitch(current.version, version)


async def read_log_formats(metastore: Metastore, keys: Keys) -> dict[str, LogFormats]:
    """pchannel -> the formats written in its log (only pchannels with a record)."""
    out: dict[str, LogFormats] = {}
    for kv in await metastore.get_prefix(keys.log_formats):
        out[kv.key[len(keys.log_formats) :]] = LogFormats.from_json(kv.value)
    return out
