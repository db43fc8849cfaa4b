"""Which message format a node writes a WAL in, checked and recorded before it opens.

Before a node opens a pchannel's WAL (which writes a FENCE at once) it reads
the cluster's format version, refuses if its release cannot write it or
cannot read a format already written in the log, and adds the format to the
pchannel's :class:`~headrace.cluster.LogFormats` record when the log does not
hold it yet. The record is written before any entry of that format, so it
always covers the log (it may name a format a failed open never wrote: that
errs on the safe side). It changes only when a log gets a new format: two
reads per open (the cluster's format, the log's formats), one write per new
format per pchannel.
"""

from __future__ import annotations

from headrace import errors
from headrace.cluster import Keys, LogFormats
from headrace.coordinator.formats import read_cluster_format
from headrace.message.formats import FormatSupport, read_refusal, write_refusal
from headrace.metastore.contract import Compare, Metastore, Put


class WriteFormats:
    """The format gate of one node: :meth:`prepare` before each open."""

    def __init__(self, metastore: Metastore, keys: Keys, support: FormatSupport) -> None:
        self.metastore = metastore
        self.keys = keys
        self.support = support

    async def prepare(self, node_id: str, pchannel: str) -> int:
        """The format to write ``pchannel``'s WAL in (the cluster's), recorded
        in its log's formats; InvalidArgument if this node must not write it
        (also when a format record is malformed: that is no damage of the log)."""
        try:
            return await self._prepare(node_id, pchannel)
        except errors.CorruptData as exc:
            raise errors.InvalidArgument(
                f"node {node_id} cannot open the WAL of {pchannel}: {exc.message}"
            ) from None

    async def _prepare(self, node_id: str, pchannel: str) -> int:
        cluster = (await read_cluster_format(self.metastore, self.keys)).version
        refusal = write_refusal(self.support, cluster)
        key = self.keys.log_format(pchannel)
        kv = await self.metastore.get(key)
        log = LogFormats() if kv is None else LogFormats.from_json(kv.value)
        refusal = refusal or read_refusal(self.support, log.written)
        if refusal:
            raise errors.InvalidArgument(
                f"node {node_id} refuses to open the WAL of {pchannel} for writing: {refusal}"
            )
        if cluster in log.written:
            return cluster
        guard = Compare.absent(key) if kv is None else Compare.mod_revision_is(key, kv.mod_revision)
        updated = log.with_format(cluster)
        result = await self.metastore.txn([guard], [Put(key, updated.to_json())])
        if not result.succeeded:
            raise errors.Unavailable(
                f"the message formats of {pchannel}'s log changed while node {node_id} "
                f"recorded format {cluster}; retrying"
            )
        return cluster
