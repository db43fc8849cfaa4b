"""The cluster-wide write stop: one record that every node obeys.

An upgrade with downtime (an Offline UpgradePlan, ``headrace writes stop``)
stops producers before it stops the nodes. Keys, under ``<root>`` =
``/headrace/<cluster>``::

    <root>/writes/stop               WriteStop: while it exists, every node
                                     refuses producers' appends with the
                                     retryable WRITES_STOPPED. Its mod revision
                                     identifies this stop.
    <root>/writes/acks/<node id>     WriteStopAck, written by each node (bound
                                     to its session lease): the stop revision
                                     it obeys and how many appends it still
                                     has in flight.

A node observes the record through the watch of its assignment reactor, so it
refuses new appends from then on; appends it admitted before finish, and once
they have, it reports ``in_flight: 0`` for that revision. :func:`drained` is the
pure decision "every live node obeys this stop and has nothing in flight",
which is what an upgrade waits for before it flushes and stops nodes.

What a stop refuses (:func:`stops`): every message a producer sends except
flush requests (a flush must still reach the WAL to seal and flush what was
written) and the commit or rollback of a transaction begun before the stop.
Time ticks, fences and seals are written by the WAL itself, not through the
Producer service, and pass.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping

from headrace import errors
from headrace.cluster import JsonRecord, Keys
from headrace.message.types import MessageType
from headrace.metastore.contract import (
    Compare,
    CompareOp,
    Delete,
    Get,
    KeyValue,
    Metastore,
    Put,
    Target,
)

PASSING = frozenset({MessageType.FLUSH, MessageType.COMMIT_TXN, MessageType.ROLLBACK_TXN})
"""Message types a write stop lets through (see the module docstring)."""


class WriteStop(JsonRecord):
    """Writes are stopped cluster-wide: why, since when, by whom."""

    reason: str
    since: float = 0.0
    by: str = ""
    """Who stopped them (an UpgradePlan ``namespace/name``, ``cli``)."""


class WriteStopAck(JsonRecord):
    """A node's report on the stop it obeys."""

    node: str
    stop_revision: int
    """Mod revision of the WriteStop record the node obeys."""
    in_flight: int
    """Appends the node admitted before the stop that have not finished yet."""
    at: float = 0.0


def stop_key(keys: Keys) -> str:
    return f"{keys.root}/writes/stop"


def acks_prefix(keys: Keys) -> str:
    return f"{keys.root}/writes/acks/"


def ack_key(keys: Keys, node: str) -> str:
    return f"{acks_prefix(keys)}{node}"


def stops(stop: WriteStop | None, kind: MessageType) -> bool:
    """Whether ``stop`` refuses a producer's message of type ``kind`` (pure)."""
    return stop is not None and kind not in PASSING


def refusal(stop: WriteStop) -> errors.WritesStopped:
    """The error a producer gets while ``stop`` holds (pure)."""
    by = f", by {stop.by}" if stop.by else ""
    return errors.WritesStopped(
        f"writes stopped: upgrade in progress ({stop.reason}{by}); retry after writes resume"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class StopState:
    """The write stop as read from the metastore."""

    stop: WriteStop | None
    revision: int
    """Mod revision of the stop record (0 when there is none)."""
    acks: Mapping[str, WriteStopAck]
    """Node id -> its latest ack (any revision)."""


def drained(state: StopState, live_nodes: Iterable[str]) -> str:
    """Why the stop is not complete yet ("" when it is): a live node has not
    obeyed this stop yet, or still has appends in flight (pure)."""
    if state.stop is None:
        return "writes are not stopped"
    waiting: list[str] = []
    for node in sorted(live_nodes):
        ack = state.acks.get(node)
        if ack is None or ack.stop_revision != state.revision:
            waiting.append(f"{node} has not acknowledged the stop")
        elif ack.in_flight:
            waiting.append(f"{node} has {ack.in_flight} append(s) in flight")
    return "; ".join(waiting)


def _parse_acks(kvs: Iterable[KeyValue], prefix: str) -> dict[str, WriteStopAck]:
    acks = {}
    for kv in kvs:
        ack = WriteStopAck.from_json(kv.value)
        acks[kv.key[len(prefix) :]] = ack
    return acks


async def read_stop(metastore: Metastore, keys: Keys) -> StopState:
    """The stop and the nodes' acks, in one read; CorruptData if malformed."""
    result = await metastore.txn([], [Get(stop_key(keys)), Get(acks_prefix(keys), prefix=True)])
    stop_kvs, ack_kvs = result.gets
    kv = stop_kvs[0] if stop_kvs else None
    return StopState(
        stop=None if kv is None else WriteStop.from_json(kv.value),
        revision=0 if kv is None else kv.mod_revision,
        acks=_parse_acks(ack_kvs, acks_prefix(keys)),
    )


async def stop_writes(metastore: Metastore, keys: Keys, reason: str, by: str = "") -> StopState:
    """Stop writes cluster-wide (idempotent: a stop already in place is kept
    as it is, with its reason, author and revision)."""
    if not reason.strip():
        raise errors.InvalidArgument("a write stop needs a reason (it is shown to producers)")
    record = WriteStop(reason=reason.strip(), since=time.time(), by=by)
    await metastore.txn([Compare.absent(stop_key(keys))], [Put(stop_key(keys), record.to_json())])
    return await read_stop(metastore, keys)


async def resume_writes(metastore: Metastore, keys: Keys) -> bool:
    """Remove the stop; whether there was one. Nodes take appends again as
    soon as they see it gone; their acks go with it."""
    result = await metastore.txn(
        [Compare(stop_key(keys), Target.VERSION, CompareOp.GREATER, 0)],
        [Delete(stop_key(keys)), Delete(acks_prefix(keys), prefix=True)],
        [Delete(acks_prefix(keys), prefix=True)],
    )
    return result.succeeded
