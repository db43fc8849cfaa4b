"""Waiting for a flush: has each pchannel's checkpoint reached the flush request?

``client.flush`` appends a flush request to every shard of a collection and
remembers, per pchannel, the largest id the node acknowledged. The flush is
done once every such pchannel's :class:`CheckpointRecord` position is at or
past that id (message ids compare within a pchannel): the flush job's commit
then covers everything written before the request. :func:`progress` is that
decision, pure; :func:`wait_flushed` polls the metastore with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable, Mapping

from headrace import errors
from headrace.cluster import Keys
from headrace.message.ids import MessageID
from headrace.metastore.contract import Get, Metastore
from headrace.table.records import CheckpointRecord


@dataclasses.dataclass(frozen=True, slots=True)
class Behind:
    """A pchannel whose checkpoint has not reached its flush request yet."""

    pchannel: str
    target: MessageID
    checkpoint: CheckpointRecord | None

    def describe(self) -> str:
        at = "no checkpoint yet" if self.checkpoint is None else f"at {self.checkpoint.position}"
        return f"{self.pchannel} checkpoint {at}, needs {self.target}"


@dataclasses.dataclass(frozen=True, slots=True)
class FlushProgress:
    """Which pchannels a flush still waits for, and why."""

    behind: tuple[Behind, ...]

    @property
    def done(self) -> bool:
        return not self.behind

    def reason(self) -> str:
        return "; ".join(b.describe() for b in self.behind) or "every checkpoint is there"


def caught_up(checkpoint: CheckpointRecord | None, target: MessageID) -> bool:
    """Whether a pchannel's checkpoint covers the message at ``target`` (pure).

    CorruptData if the checkpoint's position does not parse or is of another
    backend than ``target`` (ids of one pchannel share a backend).
    """
    if checkpoint is None:
        return False
    position = checkpoint.position_id()
    if type(position) is not type(target):
        raise errors.CorruptData(
            f"checkpoint of {checkpoint.pchannel} is at {position}, a position of another "
            f"backend than the flush request's {target}"
        )
    return not position < target


def progress(
    targets: Mapping[str, MessageID], checkpoints: Mapping[str, CheckpointRecord | None]
) -> FlushProgress:
    """The pchannels of ``targets`` whose checkpoint is not there yet (pure)."""
    return FlushProgress(
        tuple(
            Behind(pchannel, target, checkpoints.get(pchannel))
            for pchannel, target in sorted(targets.items())
            if not caught_up(checkpoints.get(pchannel), target)
        )
    )


@dataclasses.dataclass(frozen=True, slots=True)
class FlushRequested:
    """A flush of several collections, requested and not waited for."""

    collections: tuple[str, ...]
    targets: Mapping[str, MessageID]
    """Per pchannel, the latest acknowledged request (:func:`merge_targets`)."""


def merge_targets(requests: Iterable[Mapping[str, MessageID]]) -> dict[str, MessageID]:
    """Per pchannel, the latest of several flush requests' targets (pure): a
    checkpoint at or past it covers every one of them (flushes of several
    collections sharing pchannels)."""
    merged: dict[str, MessageID] = {}
    for targets in requests:
        for pchannel, target in targets.items():
            known = merged.get(pchannel)
            merged[pchannel] = target if known is None or known < target else known
    return merged


async def read_checkpoints(
    metastore: Metastore, keys: Keys, pchannels: list[str]
) -> dict[str, CheckpointRecord | None]:
    """The pchannels' checkpoints, read at one revision."""
    result = await metastore.txn([], [Get(keys.checkpoint(p)) for p in pchannels])
    return {
        pchannel: CheckpointRecord.from_json(kvs[0].value) if kvs else None
        for pchannel, kvs in zip(pchannels, result.gets, strict=True)
    }


@dataclasses.dataclass(frozen=True, slots=True)
class FlushOutcome:
    """What ``client.flush`` did: the acknowledged request per pchannel, and
    the checkpoints that cover them once waited for."""

    collection: str
    targets: Mapping[str, MessageID]
    checkpoints: Mapping[str, CheckpointRecord]
    """Empty unless the call waited."""
    waited: bool

    def describe(self) -> dict[str, object]:
        return {
            "collection": self.collection,
            "pchannels": {
                pchannel: {
                    "requested": str(target),
                    "checkpoint": (
                        self.checkpoints[pchannel].position
                        if pchannel in self.checkpoints
                        else None
                    ),
                }
                for pchannel, target in sorted(self.targets.items())
            },
            "waited": self.waited,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class WaitOptions:
    timeout: float | None = 300.0
    """Seconds to wait; None: no limit."""
    poll_interval: float = 0.2


async def wait_flushed(
    metastore: Metastore,
    keys: Keys,
    collection: str,
    targets: Mapping[str, MessageID],
    options: WaitOptions,
) -> dict[str, CheckpointRecord]:
    """Poll until every pchannel's checkpoint reaches its target; the checkpoints.

    Unavailable (retryable) after ``options.timeout`` seconds, naming each
    pchannel still behind and where its checkpoint is.
    """
    deadline = None if options.timeout is None else time.monotonic() + options.timeout
    pchannels = sorted(targets)
    while True:
        checkpoints = await read_checkpoints(metastore, keys, pchannels)
        state = progress(targets, checkpoints)
        if state.done:
            return {p: c for p, c in checkpoints.items() if c is not None}
        if deadline is not None and time.monotonic() >= deadline:
            raise errors.Unavailable(timeout_message(collection, options.timeout or 0.0, state))
        await asyncio.sleep(options.poll_interval)


def timeout_message(collection: str, timeout: float, state: FlushProgress) -> str:
    """What a flush that ran out of time says (pure)."""
    return (
        f"flush of {collection} not committed within {timeout:g}s (deadline exceeded): "
        f"{state.reason()} (is a flush runner running? `headrace status` shows checkpoints)"
    )
