"""Read what decides a flush: per pchannel, the last seal, the checkpoint and
the Assignment (the input of :func:`spark_apps.schedule.next_step`).

Shared by the standalone's runner and the operator, which both launch flushes;
it needs only the metastore and the records (no Spark, no pyarrow).
"""

from __future__ import annotations

from headrace import errors
from headrace.cluster import Assignment, Keys
from headrace.metastore.contract import Metastore
from headrace.table.records import CheckpointRecord, SealRecord, seals_prefix
from spark_apps.schedule import Channel, Unreadable


async def read_channels(metastore: Metastore, keys: Keys) -> list[Channel | Unreadable]:
    """The seal, checkpoint and Assignment of every pchannel with a seal; a
    pchannel whose records do not decode is Unreadable (the others go on)."""
    channels: list[Channel | Unreadable] = []
    for kv in await metastore.get_prefix(seals_prefix(keys)):
        pchannel = kv.key.removeprefix(seals_prefix(keys))
        checkpoint = await metastore.get(keys.checkpoint(pchannel))
        assignment = await metastore.get(keys.pchannel(pchannel))
        try:
            channel = Channel(
                pchannel,
                SealRecord.from_json(kv.value),
                None if checkpoint is None else CheckpointRecord.from_json(checkpoint.value),
                None if assignment is None else Assignment.from_json(assignment.value),
            )
            for record in (channel.seal, channel.checkpoint):
                if record is not None:
                    record.position_id()  # a position of an unknown backend fails here
        except errors.HeadraceError as exc:
            channels.append(Unreadable(pchannel, str(exc)))
            continue
        channels.append(channel)
    return channels
