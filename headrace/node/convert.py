"""Conversions between wire protos and the node's message and WAL types."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from headrace import errors
from headrace.cluster import ClusterConfig
from headrace.message import batch, ids
from headrace.message.records import BatchEntry
from headrace.message.types import (
    VCHANNEL_PATTERN,
    LogEntry,
    Message,
    MessageType,
    validate_vchannel,
)
from headrace.proto import streaming_pb2 as pb
from headrace.wal.api import AppendResult, BatchAppendResult, DeliverPolicy, ReadOptions
from headrace.wal.hosted import HostedWAL
from headrace.wal.scanner import Scanner
from headrace.wal.validation import GOOD_VCHANNELS_MAX

_EMPTY: Mapping[str, str] = MappingProxyType({})
_ALL_CODES = frozenset(int(t) for t in MessageType)
_PRODUCIBLE = {int(t): t for t in MessageType if not t.is_system}
_POLICIES = {
    pb.DELIVER_POLICY_UNSPECIFIED: DeliverPolicy.ALL,
    pb.DELIVER_POLICY_ALL: DeliverPolicy.ALL,
    pb.DELIVER_POLICY_LATEST: DeliverPolicy.LATEST,
    pb.DELIVER_POLICY_START_FROM: DeliverPolicy.START_FROM,
    pb.DELIVER_POLICY_START_AFTER: DeliverPolicy.START_AFTER,
}


class Admission:
    """Turns a producer's protos into messages for one pchannel, checking them.

    ``config``: the cluster's config, when known, to refuse a vchannel that
    routes to another pchannel. Vchannels found good are remembered (at most
    :data:`GOOD_VCHANNELS_MAX`), so one admission kept while ``config`` holds
    checks and routes each name once (the node keeps one per pchannel and
    config: see :meth:`ProducerService.admission`).
    """

    def __init__(self, pchannel: str, config: ClusterConfig | None) -> None:
        self.pchannel = pchannel
        self.config = config
        self._good: set[str] = set()
        """Names found good (well formed, hence ASCII: a record batch's header
        field holding one is its ASCII bytes)."""
        self._good_raw: set[bytes] = set()
        """The same names as a record batch's header field holds them."""

    def _check_vchannel(self, vchannel: str) -> None:
        if not VCHANNEL_PATTERN.match(vchannel):
            validate_vchannel(vchannel)
        if self.config is not None and self.config.pchannels:
            owner = self.config.route(vchannel)
            if owner != self.pchannel:
                raise errors.InvalidArgument(
                    f"vchannel {vchannel!r} belongs to {owner}, not {self.pchannel}"
                )
        good = self._good
        if len(good) >= GOOD_VCHANNELS_MAX:
            good.clear()
            self._good_raw.clear()
        good.add(vchannel)
        self._good_raw.add(vchannel.encode("ascii"))

    def record_batch(self, data: bytes) -> errors.HeadraceError | None:
        """Why a producer's record batch is not acceptable here (its vchannel is
        malformed or routes to another pchannel), read from its header; None if
        it may go on (a malformed batch too: the WAL refuses it, saying why).
        A batch whose vchannel field holds a name found good goes on unread."""
        raw = batch.raw_vchannel(data)
        if raw.isascii() and raw.decode("ascii") in self._good:
            return None
        try:
            vchannel = batch.read_header(data).vchannel
        except errors.CorruptData:
            return None
        if vchannel not in self._good:
            try:
                self._check_vchannel(vchannel)
            except errors.InvalidArgument as exc:
                return exc
        return None

    def record_batches(self, datas: Sequence[bytes]) -> dict[int, errors.HeadraceError]:
        """:meth:`record_batch` of each of ``datas`` that it refuses, by position
        (empty: all may go on). A request whose batches' vchannel fields all
        hold names found good (the common request) is answered by one set
        comparison, without a call per batch."""
        raws = batch.raw_vchannels(datas)
        if self._good_raw.issuperset(raws):
            return {}
        refused: dict[int, errors.HeadraceError] = {}
        good = self._good_raw
        for at, (data, raw) in enumerate(zip(datas, raws, strict=True)):
            if raw in good:
                continue
            refusal = self.record_batch(data)
            if refusal is not None:
                refused[at] = refusal
        return refused

    def message(self, proto: pb.ProduceMessage) -> Message:
        """The message ``proto`` carries; InvalidArgument if it is not acceptable."""
        mtype = _PRODUCIBLE.get(proto.type)
        if mtype is None:
            if proto.type in _ALL_CODES:
                raise errors.InvalidArgument(
                    f"message type {MessageType(proto.type).name} is written by the WAL itself"
                )
            raise errors.InvalidArgument(f"unknown message type code {proto.type}")
        vchannel = proto.vchannel
        if vchannel not in self._good:
            self._check_vchannel(vchannel)
        props = proto.properties
        properties = {key: props[key] for key in props} if props else _EMPTY
        return Message(mtype, vchannel, proto.payload, properties, 0, 0, proto.txn_id)


def fill_batch_results(
    out: RepeatedCompositeFieldContainer[pb.RecordBatchResult],
    outcomes: Sequence[BatchAppendResult | errors.HeadraceError],
    to_proto: Callable[[errors.HeadraceError], pb.Error],
) -> None:
    """Append one RecordBatchResult per outcome to ``out``."""
    protos: dict[int, pb.Error] = {}
    add = out.add
    for outcome in outcomes:
        if isinstance(outcome, BatchAppendResult):
            # Field by field: a quarter cheaper than add()'s keywords (one
            # result per batch, most of one message when a call spreads over
            # many vchannels); txn_id 0 is the proto default, left unset.
            result = add()
            result.id = str(outcome.record_id)
            result.count = outcome.count
            result.timetick = outcome.timetick
            result.term = outcome.term
            if outcome.txn_id:
                result.txn_id = outcome.txn_id
        else:
            error = protos.get(id(outcome))
            if error is None:
                error = protos[id(outcome)] = to_proto(outcome)
            add(error=error)


def fill_results(
    out: RepeatedCompositeFieldContainer[pb.MessageResult],
    outcomes: Sequence[AppendResult | errors.HeadraceError],
    to_proto: Callable[[errors.HeadraceError], pb.Error],
) -> None:
    """Append one MessageResult per outcome to ``out``."""
    protos: dict[int, pb.Error] = {}
    add = out.add
    for outcome in outcomes:
        if isinstance(outcome, AppendResult):
            add(
                id=str(outcome.id),
                timetick=outcome.timetick,
                term=outcome.term,
                txn_id=outcome.txn_id,
            )
        else:
            error = protos.get(id(outcome))
            if error is None:
                error = protos[id(outcome)] = to_proto(outcome)
            add(error=error)


def read_options(request: pb.ConsumeRequest) -> ReadOptions:
    """The scanner options a Consume request asks for; InvalidArgument if malformed."""
    policy = _POLICIES.get(request.policy)
    if policy is None:
        raise errors.InvalidArgument(f"unknown deliver policy {request.policy}")
    start_id = None
    if policy in (DeliverPolicy.START_FROM, DeliverPolicy.START_AFTER):
        if not request.start_id:
            raise errors.InvalidArgument(f"deliver policy {policy.value} needs a start_id")
        start_id = ids.parse(request.start_id)
    types = tuple(MessageType.parse(code) for code in request.types)
    for vchannel in request.vchannels:
        validate_vchannel(vchannel)
    return ReadOptions(
        policy=policy,
        start_id=start_id,
        vchannels=frozenset(request.vchannels),
        types=frozenset(types),
        timetick_gt=request.timetick_gt if request.HasField("timetick_gt") else None,
        timetick_ge=request.timetick_ge if request.HasField("timetick_ge") else None,
    )


MESSAGE_OVERHEAD = 64
"""Bytes a message of a Consume response counts beyond its payload (its id,
vchannel and fixed fields), against the response's byte bound."""


def entry_bytes(entry: LogEntry | BatchEntry) -> int:
    """What ``entry`` counts against a Consume response's byte bound (and a
    stream's read-ahead): a record batch its bytes, a message its payload
    plus :data:`MESSAGE_OVERHEAD`."""
    if type(entry) is BatchEntry:
        return len(entry.data)
    assert isinstance(entry, LogEntry)
    return len(entry.message.payload) + MESSAGE_OVERHEAD


def add_consumed(out: RepeatedCompositeFieldContainer[pb.ConsumedMessage], entry: LogEntry) -> int:
    """Append ``entry`` to a response; what it counts (:func:`entry_bytes`)."""
    msg = entry.message
    out.add(
        id=str(entry.id),
        type=msg.type,
        vchannel=msg.vchannel,
        timetick=msg.timetick,
        term=msg.term,
        txn_id=msg.txn_id,
        properties=msg.properties,
        payload=msg.payload,
    )
    return len(msg.payload) + MESSAGE_OVERHEAD


@dataclasses.dataclass(frozen=True, slots=True)
class Packed:
    """What went into one Consume response."""

    messages: int
    newest: int
    """Timetick of the last message packed (0 if none)."""
    bytes: int
    """What the entries packed count (:func:`entry_bytes`)."""


def messages_in(entries: Iterable[LogEntry | BatchEntry]) -> int:
    """How many messages ``entries`` hold (a batch counts as its messages)."""
    return sum(e.count if type(e) is BatchEntry else 1 for e in entries)


def pack_messages(
    out: RepeatedCompositeFieldContainer[pb.ConsumedMessage],
    carry: collections.deque[LogEntry | BatchEntry],
    max_messages: int,
    max_bytes: int,
) -> Packed:
    """Move entries of ``carry`` to ``out`` within the bounds (no batches in it)."""
    size = 0
    newest = 0
    while carry and len(out) < max_messages and size < max_bytes:
        entry = carry.popleft()
        assert isinstance(entry, LogEntry), "a client that reads no batches gets none"
        size += add_consumed(out, entry)
        newest = entry.message.timetick
    return Packed(len(out), newest, size)


def pack_items(
    out: RepeatedCompositeFieldContainer[pb.ConsumedItem],
    carry: collections.deque[LogEntry | BatchEntry],
    max_messages: int,
    max_bytes: int,
) -> Packed:
    """Move entries of ``carry`` to ``out`` within the bounds: a batch goes as
    it is stored (at least one item goes, whatever its size)."""
    size = count = newest = 0
    while carry and count < max_messages and size < max_bytes:
        entry = carry.popleft()
        if type(entry) is BatchEntry:
            # Field by field: ``add(batch=ConsumedBatch(...))`` copies the
            # batch's bytes twice (into the new message, then into the
            # response), 2.5 times the cost for a 512 KiB batch.
            item = out.add().batch
            item.first_id = str(entry.id)
            item.data = entry.data
            size += len(entry.data)
            count += entry.count
            newest = entry.last_timetick
            continue
        assert isinstance(entry, LogEntry)
        out.add(message=consumed_message(entry))
        size += len(entry.message.payload) + MESSAGE_OVERHEAD
        count += 1
        newest = entry.message.timetick
    return Packed(count, newest, size)


def consumed_message(entry: LogEntry) -> pb.ConsumedMessage:
    """``entry`` as a message of a Consume response (see :func:`add_consumed`)."""
    msg = entry.message
    return pb.ConsumedMessage(
        id=str(entry.id),
        type=msg.type,
        vchannel=msg.vchannel,
        timetick=msg.timetick,
        term=msg.term,
        txn_id=msg.txn_id,
        properties=msg.properties,
        payload=msg.payload,
    )


def consume_header(
    node_id: str, term: int, request: pb.ConsumeRequest, scanner: Scanner
) -> pb.ConsumeResponse:
    """The first response of a Consume stream (see the proto)."""
    header = pb.ConsumeResponse(node_id=node_id, term=term)
    position = scanner.position
    if request.policy == pb.DELIVER_POLICY_LATEST and position is not None and position.id:
        header.start_after_id = str(position.id)
        header.start_after_timetick = position.timetick
    return header


def wal_info(wal: HostedWAL) -> pb.WALInfo:
    last_id = wal.last_id
    return pb.WALInfo(
        pchannel=wal.pchannel,
        term=wal.term,
        state=wal.state.value,
        last_id="" if last_id is None else str(last_id),
        last_timetick=wal.last_timetick,
        stats={key: str(value) for key, value in wal.stats().items()},
    )
