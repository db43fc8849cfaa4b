"""One pchannel's share of a producer: its queue and its Produce stream.

A stream whose owner writes message format 1 carries messages, each stamped
with the producer's dedup properties. One whose owner writes format 2 carries
record batches: the lane seals the messages it takes into batches
(:func:`~headrace.client.sending.seal`, per vchannel and transaction, each
with the producer's batch id and the next sequence) once, and resends those
same bytes until they are answered, so the WAL's per-batch dedup holds over
retries and owner changes.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Sequence

import grpc
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from headrace import errors
from headrace.client.discovery import Owner
from headrace.client.errors import from_proto, from_rpc_error
from headrace.client.sending import Item, Outcome, ProducerOptions, Sealed, Sealing, seal
from headrace.client.session import Session
from headrace.guarded import TaskFailure, cancel_and_settle, guarded_task
from headrace.message import batch, ids
from headrace.message.batch import Limits
from headrace.proto import rpc
from headrace.proto import streaming_pb2 as pb
from headrace.wal.api import AppendResult, BatchAppendResult, append_result

log = logging.getLogger(__name__)

ProduceCall = rpc.ProduceCall


@dataclasses.dataclass(frozen=True, slots=True)
class LaneContext:
    """What a lane uses of its producer."""

    session: Session
    options: ProducerOptions
    producer_id: str
    settle: Callable[[Item, Sequence[Outcome] | errors.HeadraceError], None]
    """Reports an item's outcomes (one each, or one error for all) to its sender."""
    settle_each: Callable[[Sequence[Item], Sequence[Outcome]], None]
    """Reports the one outcome of each of items of one message each."""
    batch_producer_id: int
    """The producer id of its record batches (message format 2)."""
    next_sequence: Callable[[], int]
    """The producer-wide next sequence of a record batch."""


@dataclasses.dataclass(frozen=True, slots=True)
class Sent:
    """One request on the wire: its messages, and the record batches they were
    sealed into (empty on a format 1 stream)."""

    batch_id: int
    items: list[Item]
    sealed: tuple[Sealed, ...] = ()


@dataclasses.dataclass(slots=True)
class _Stream:
    """Bookkeeping of one Produce stream."""

    call: ProduceCall
    owner: Owner
    inflight: collections.deque[Sent] = dataclasses.field(default_factory=collections.deque)
    retry: list[Item] = dataclasses.field(default_factory=list)
    retry_sealed: list[Sealed] = dataclasses.field(default_factory=list)
    sealing: Sealing | None = None
    """How messages are sealed into record batches: the owner writes format 2."""
    error: errors.HeadraceError | None = None
    broken: bool = False
    """The stream itself failed: outcomes of in-flight batches are unknown."""
    cut_by_deadline: bool = False
    """It ended because the oldest in-flight message reached its deadline."""
    acked: int = 0

    def fail(self, error: errors.HeadraceError, *, broken: bool = False) -> None:
        if self.error is None:
            self.error = error
        self.broken = self.broken or broken


def expiry_error(
    previous: errors.HeadraceError | None,
    current: errors.HeadraceError,
    *,
    cut_by_deadline: bool,
) -> errors.HeadraceError:
    """The error that messages reaching their deadline fail with, after an
    attempt failed with ``current`` and the earlier ones (since the last
    acknowledgement) with ``previous`` (pure).

    What an owner answered stays the cause when the deadline itself cut the
    last attempt short ("did not answer in time"), and a full disk stays the
    cause over the routing errors that can follow it (an owner that lost its
    session because its metastore shares the disk answers NOT_OWNER).
    """
    if previous is None:
        return current
    if cut_by_deadline:
        return previous
    if isinstance(previous, errors.StorageFull) and not isinstance(current, errors.StorageFull):
        return previous
    return current


_ROUTING = (errors.NotOwner, errors.Fenced, errors.Closed)
"""Errors of an owner change, which retries ride out as a matter of course."""


def worth_a_warning(previous: errors.HeadraceError | None, current: errors.HeadraceError) -> bool:
    """Whether a retry's error is logged as a warning (pure): the first of a
    kind that is not an owner change (a full disk, an unreachable node), so a
    user waiting for the deadline sees why."""
    if isinstance(current, _ROUTING):
        return False
    return previous is None or previous.code is not current.code


class Lane:
    """Queue and stream of one pchannel; runs until closed."""

    def __init__(self, context: LaneContext, pchannel: str) -> None:
        self.context = context
        self.pchannel = pchannel
        self.options = context.options
        self.queue: collections.deque[Item] = collections.deque()
        self.sealed: collections.deque[Sealed] = collections.deque()
        """Record batches sealed for a format 2 owner and not yet answered, ahead
        of ``queue`` (resent as they are)."""
        self.owner: Owner | None = None
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._batch_ids = itertools.count(1)
        self._task = self._start()

    def _start(self) -> asyncio.Task[None]:
        return guarded_task(self._run(), f"produce-{self.pchannel}", self._on_failure, logger=log)

    def push(self, items: list[Item]) -> None:
        """Queue ``items`` (of one call, in order) to be sent."""
        self.queue.extend(items)
        self._idle.clear()
        self._wake.set()
        if self._task.done() and not self._task.cancelled():
            self._task = self._start()

    async def idle(self) -> None:
        """Wait until every pushed message has its outcome."""
        if self._task.done():
            return
        await self._idle.wait()

    async def close(self) -> None:
        await cancel_and_settle([self._task], what=f"closing the producer lane of {self.pchannel}")
        closed = errors.Closed("the producer was closed before the message was acknowledged")
        self._fail_all(closed)

    # ----------------------------------------------------------- the loop

    async def _on_failure(self, failure: TaskFailure) -> None:
        """A bug in the lane fails the queued messages at once instead of hanging
        them; the next message pushed starts the lane again."""
        self._fail_all(
            errors.HeadraceError(f"the producer lane of {self.pchannel}: {failure.describe()}")
        )
        self._idle.set()

    async def _run(self) -> None:
        backoff = self.options.retry_backoff
        avoid: Owner | None = None
        last_error: errors.HeadraceError | None = None
        while True:
            while not self.queue and not self.sealed:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
            try:
                owner = await self._find_owner(avoid, backoff)
            except errors.Unavailable as exc:
                self._expire(last_error or exc)
                continue
            except errors.HeadraceError as exc:
                # Closed, or the client's view of the cluster failed.
                self._fail_all(exc)
                continue
            self.owner = owner
            try:
                stream = await self._stream(owner)
            except errors.InvalidArgument as exc:
                # This client cannot talk to the owner as configured (it needs
                # TLS or a client certificate): no retry can change that.
                self.owner = None
                self._fail_all(exc)
                continue
            self.owner = None
            error = stream.error or errors.Unavailable(f"{owner.address} ended the stream")
            if not error.retryable:
                self._fail_all(error)
                continue
            log.log(
                logging.WARNING if worth_a_warning(last_error, error) else logging.INFO,
                "producing to %s at %s: %s; retrying until the messages' deadline",
                self.pchannel,
                owner.address,
                error,
            )
            last_error = expiry_error(
                None if stream.acked else last_error, error, cut_by_deadline=stream.cut_by_deadline
            )
            avoid = owner
            backoff = (
                self.options.retry_backoff
                if stream.acked
                else min(backoff * 2, self.options.max_retry_backoff)
            )
            self._expire(last_error)

    async def _find_owner(self, avoid: Owner | None, backoff: float) -> Owner:
        """The owner to try next: preferably another than ``avoid``."""
        view = self.context.session.view
        deadline = self.sealed[0].deadline if self.sealed else self.queue[0].deadline
        if avoid is not None:
            try:
                return await view.wait_owner(
                    self.pchannel, min(deadline, time.monotonic() + backoff), avoid=avoid
                )
            except errors.Unavailable:
                pass
        return await view.wait_owner(self.pchannel, deadline)

    def _expire(self, error: errors.HeadraceError) -> None:
        now = time.monotonic()
        settle = self.context.settle
        while self.sealed and self.sealed[0].deadline <= now:
            for item in self.sealed.popleft().items:
                settle(item, error)
        if self.sealed:
            return  # what is queued was taken later: it expires later
        while self.queue and self.queue[0].deadline <= now:
            settle(self.queue.popleft(), error)

    def _fail_all(self, error: errors.HeadraceError) -> None:
        settle = self.context.settle
        while self.sealed:
            for item in self.sealed.popleft().items:
                settle(item, error)
        while self.queue:
            settle(self.queue.popleft(), error)

    # ---------------------------------------------------------- one stream

    async def _stream(self, owner: Owner) -> _Stream:
        """Send over one stream to ``owner`` until it fails or the pchannel moves on;
        then requeue what is unacknowledged."""
        channel = self.context.session.channels.get(owner.address)
        call = rpc.producer_stub(channel).Produce()
        stream = _Stream(call, owner)
        name = f"produce-{self.pchannel}-{owner.term}"
        body = asyncio.create_task(self._converse(stream), name=name)
        watcher = asyncio.create_task(self._watch_owner(stream), name=f"{name}-successor")
        try:
            await asyncio.wait((body, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            failures = await cancel_and_settle(
                (body, watcher), what=f"producing to {self.pchannel}", logger=log
            )
            call.cancel()
            unresolved = [
                *stream.retry,
                *(i for sent in stream.inflight if not sent.sealed for i in sent.items),
            ]
            self.queue.extendleft(reversed(unresolved))
            resend = [*stream.retry_sealed, *(s for sent in stream.inflight for s in sent.sealed)]
            self.sealed.extendleft(reversed(resend))
        if failures:
            raise failures[0]
        return stream

    async def _converse(self, stream: _Stream) -> None:
        receiver: asyncio.Task[None] | None = None
        failures: list[Exception] = []
        try:
            opened = await self._open(stream)
            if opened:
                receiver = asyncio.create_task(
                    self._receive(stream), name=f"produce-{self.pchannel}-receiver"
                )
                await self._send(stream, receiver)
                if not stream.broken:
                    await asyncio.wait((receiver,))
        except grpc.RpcError as exc:
            stream.fail(from_rpc_error(exc, stream.owner.address), broken=True)
        except asyncio.InvalidStateError:
            # A write raced the end of the call (the node went away): the
            # receiver may not have seen the status yet.
            stream.fail(
                errors.Unavailable(f"{stream.owner.address} ended the Produce stream"),
                broken=True,
            )
        finally:
            if receiver is not None:
                failures = await cancel_and_settle(
                    (receiver,), what=f"producing to {self.pchannel}", logger=log
                )
        if failures:
            raise failures[0]

    async def _watch_owner(self, stream: _Stream) -> None:
        """Fail ``stream`` once the pchannel has an ASSIGNED owner of a higher term.

        A stalled owner (paused, partitioned) answers nothing, so without this
        the stream would wait for the messages' deadline although a new owner
        serves. Resending the unacknowledged messages is safe: the new owner
        fenced the old term in the backend before serving (a late write of the
        old owner never becomes readable), and its dedup window holds what the
        old owner wrote before the fence.
        """
        try:
            owner = await self.context.session.view.wait_successor(stream.owner)
        except errors.HeadraceError as exc:
            # The client was closed, or its view of the cluster failed.
            stream.fail(exc, broken=True)
            return
        stream.fail(
            errors.Unavailable(
                f"{self.pchannel} moved to {owner.node} at term {owner.term} "
                f"while the stream to {stream.owner.address} (term {stream.owner.term}) was open"
            ),
            broken=True,
        )

    async def _open(self, stream: _Stream) -> bool:
        owner = stream.owner
        await stream.call.write(
            pb.ProduceRequest(
                open=pb.OpenProducer(
                    pchannel=self.pchannel, term=owner.term, producer_id=self.context.producer_id
                )
            )
        )
        first = await stream.call.read()
        if not isinstance(first, pb.ProduceResponse) or first.WhichOneof("response") != "opened":
            stream.fail(errors.Unavailable(f"{owner.address} did not open a Produce stream"))
            return False
        opened = first.opened
        if opened.message_format == batch.FORMAT_VERSION:
            most = opened.max_message_bytes
            stream.sealing = Sealing(
                self.context.batch_producer_id,
                self.context.next_sequence,
                Limits(most, opened.max_batch_bytes or most),
            )
        elif self.sealed:
            # An owner writing format 1 (it still held a log of that format):
            # the messages go one by one again, with their dedup properties.
            self.queue.extendleft(reversed([i for s in self.sealed for i in s.items]))
            self.sealed.clear()
        return True

    async def _send(self, stream: _Stream, receiver: asyncio.Task[None]) -> None:
        options = self.options
        while stream.error is None and not receiver.done():
            if (self.queue or self.sealed) and len(stream.inflight) < options.max_inflight_batches:
                if options.linger and len(self.queue) < options.max_batch_messages:
                    await asyncio.sleep(options.linger)
                sent = self._next_request(stream)
                if sent is None:
                    continue
                stream.inflight.append(sent)
                await stream.call.write(self._request(sent))
                continue
            if not self.queue and not self.sealed and not stream.inflight:
                self._idle.set()
            self._wake.clear()
            timeout = None
            if stream.inflight:
                timeout = max(0.0, stream.inflight[0].items[0].deadline - time.monotonic())
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                stream.cut_by_deadline = True
                stream.fail(
                    errors.Unavailable(f"{stream.owner.address} did not answer in time"),
                    broken=True,
                )

    def _next_request(self, stream: _Stream) -> Sent | None:
        """What to send next: messages (format 1), or record batches, those
        sealed before first (format 2); None if every message taken failed to
        encode (each got its error)."""
        batch_id = next(self._batch_ids)
        sealing = stream.sealing
        if sealing is None:
            items = self._take_batch()
            for item in items:
                item.sent_one_by_one = True
            return Sent(batch_id, items)
        if not self.sealed:
            sealed, failed = seal(self._take_batch(), sealing)
            for item, error in failed:
                self.context.settle(item, error)
            self.sealed.extend(sealed)
            if not sealed:
                return None
        units = [self.sealed.popleft()]
        count = units[0].count
        while self.sealed and count + self.sealed[0].count <= self.options.max_batch_messages:
            count += self.sealed[0].count
            units.append(self.sealed.popleft())
        return Sent(batch_id, [i for unit in units for i in unit.items], tuple(units))

    def _take_batch(self) -> list[Item]:
        options = self.options
        queue = self.queue
        items = [queue.popleft()]
        count, size = len(items[0].messages), items[0].size
        while queue and count + len(queue[0].messages) <= options.max_batch_messages:
            size += queue[0].size
            if size > options.max_batch_bytes:
                break
            count += len(queue[0].messages)
            items.append(queue.popleft())
        return items

    @staticmethod
    def _request(sent: Sent) -> pb.ProduceRequest:
        request = pb.ProduceRequest()
        produce = request.batch
        produce.batch_id = sent.batch_id
        if sent.sealed:
            produce.record_batches.extend([unit.data for unit in sent.sealed])
            return request
        add = produce.messages.add
        for item in sent.items:
            for i in range(len(item.messages)):
                msg = item.stamped(i)
                add(
                    type=msg.type,
                    vchannel=msg.vchannel,
                    payload=msg.payload,
                    properties=msg.properties,
                    txn_id=msg.txn_id,
                )
        return request

    async def _receive(self, stream: _Stream) -> None:
        call = stream.call
        try:
            while stream.error is None or (stream.inflight and not stream.broken):
                response = await call.read()
                if not isinstance(response, pb.ProduceResponse):
                    stream.fail(errors.Unavailable("the node ended the stream"), broken=True)
                    return
                result = response.batch
                if (
                    response.WhichOneof("response") != "batch"
                    or not stream.inflight
                    or result.batch_id != stream.inflight[0].batch_id
                ):
                    stream.fail(errors.Unavailable("unexpected Produce response"), broken=True)
                    return
                sent = stream.inflight.popleft()
                if sent.sealed:
                    self._settle_sealed(stream, sent.sealed, result.batch_results)
                else:
                    self._settle(stream, sent.items, result.results)
                self._wake.set()
        except grpc.RpcError as exc:
            stream.fail(from_rpc_error(exc, stream.owner.address), broken=True)
        finally:
            self._wake.set()

    def _settle(
        self,
        stream: _Stream,
        items: list[Item],
        results: RepeatedCompositeFieldContainer[pb.MessageResult],
    ) -> None:
        """Each message's outcome from its result (format 1); a message whose
        error is retryable is sent again."""
        if len(results) != sum(len(item.messages) for item in items):
            stream.retry.extend(items)
            stream.fail(errors.Unavailable("a Produce response of the wrong length"), broken=True)
            return
        settle = self.context.settle
        at = 0
        for item in items:
            count = len(item.messages)
            outcomes = [_outcome(result) for result in results[at : at + count]]
            at += count
            stream.acked += sum(isinstance(o, AppendResult) for o in outcomes)
            retry = [isinstance(o, errors.HeadraceError) and o.retryable for o in outcomes]
            if not any(retry):
                settle(item, outcomes)
                continue
            for single, outcome, again in zip(item.singles(), outcomes, retry, strict=True):
                if again and isinstance(outcome, errors.HeadraceError):
                    stream.retry.append(single)
                    stream.fail(outcome)
                else:
                    settle(single, [outcome])

    def _settle_sealed(
        self,
        stream: _Stream,
        sealed: tuple[Sealed, ...],
        results: RepeatedCompositeFieldContainer[pb.RecordBatchResult],
    ) -> None:
        """Each record batch's messages from its result: message ``i`` has the
        first's id with index ``i`` and the batch's base timetick + ``i``."""
        if len(results) != len(sealed):
            stream.retry_sealed.extend(sealed)
            stream.fail(errors.Unavailable("a Produce response of the wrong length"), broken=True)
            return
        settle = self.context.settle
        acked = 0
        # Items of batches of one message (a call spread over many vchannels),
        # settled together at the end, each with its outcome.
        singles: list[Item] = []
        outcomes: list[Outcome] = []
        for unit, result in zip(sealed, results, strict=True):
            if result.HasField("error"):
                error = from_proto(result.error)
                if error.retryable:
                    stream.retry_sealed.append(unit)
                    stream.fail(error)
                else:
                    for item in unit.items:
                        settle(item, error)
                continue
            first = _first_id(result, unit.count)
            if isinstance(first, errors.HeadraceError):
                for item in unit.items:
                    settle(item, first)
                continue
            count = unit.count
            acked += count
            if count == 1:
                singles += unit.items
                outcomes.append(append_result(first, result.timetick, result.term, result.txn_id))
                continue
            each = BatchAppendResult(
                first, count, result.timetick, result.term, result.txn_id
            ).results()
            if len(unit.items) == 1:
                settle(unit.items[0], each)
            else:
                at = 0
                for item in unit.items:
                    settle(item, each[at : at + len(item.messages)])
                    at += len(item.messages)
        if singles:
            self.context.settle_each(singles, outcomes)
        stream.acked += acked


def _outcome(result: pb.MessageResult) -> Outcome:
    """A message's outcome from its result (format 1)."""
    if result.HasField("error"):
        return from_proto(result.error)
    try:
        mid = ids.parse(result.id)
    except errors.HeadraceError as exc:
        return exc
    return AppendResult(mid, result.timetick, result.term, result.txn_id)


def _first_id(result: pb.RecordBatchResult, count: int) -> ids.MessageID | errors.HeadraceError:
    """The id of the first message of a record batch of ``count`` messages, from
    its result; the error if the result does not fit it."""
    if result.count != count:
        return errors.Unavailable(
            f"the owner acknowledged {result.count} messages of a record batch of {count}"
        )
    try:
        return ids.parse(result.id)
    except errors.HeadraceError as exc:
        return exc
