"""A node's side of the cluster-wide write stop (:mod:`headrace.coordinator.writestop`).

:class:`WriteGate` holds the stop the node last saw (the assignment reactor
hands it every change of the stop record, from its listing and its watch) and
counts the producers' appends in flight. The Producer service asks it before
each append: while a stop holds, a producer's messages are refused with the
retryable WRITES_STOPPED (flush requests and the end of a transaction pass);
appends admitted before the stop was seen finish, and are counted until they
do. Admission and counting happen without an ``await`` between them, so once
the gate has seen a stop, the count covers every append that can still land.

:meth:`WriteGate.report` (a guarded task of the node) publishes the node's
:class:`~headrace.coordinator.writestop.WriteStopAck` (the stop revision it
obeys, appends in flight) under its session lease whenever either changes,
and removes it when writes resume, so an upgrade can wait until every live
node obeys the stop with nothing in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence

from headrace import errors
from headrace.cluster import Keys
from headrace.coordinator.writestop import (
    WriteStop,
    WriteStopAck,
    ack_key,
    refusal,
    stops,
)
from headrace.message import batch
from headrace.message.types import MessageType
from headrace.metastore.contract import KeyValue, Metastore

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Observed:
    """The stop a node obeys and its revision (None, 0: writes flow)."""

    stop: WriteStop | None = None
    revision: int = 0


class WriteGate:
    """The write stop as one node sees it, and its appends in flight."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.observed = Observed()
        self.in_flight = 0
        """Producers' messages being appended now."""
        self.changed = asyncio.Event()
        """Set whenever the stop or the count changes (the report loop clears it)."""

    def observe(self, kv: KeyValue | None) -> None:
        """Take in the stop record (None: deleted). A malformed record counts
        as a stop: refusing writes is safe, taking them against an operator's
        intent is not."""
        if kv is None:
            observed = Observed()
        else:
            try:
                stop = WriteStop.from_json(kv.value)
            except errors.CorruptData as exc:
                log.error("write stop record is malformed; writes stay stopped: %s", exc)
                stop = WriteStop(reason=f"malformed write stop record: {exc.message}")
            observed = Observed(stop, kv.mod_revision)
        if observed != self.observed:
            self.observed = observed
            if observed.stop is not None:
                log.warning("node %s: writes stopped: %s", self.node_id, observed.stop.reason)
            else:
                log.info("node %s: writes resumed", self.node_id)
            self.changed.set()

    def refusal_for(self, kind: MessageType) -> errors.WritesStopped | None:
        """The error a producer's message of ``kind`` gets now (None: it may go)."""
        stop = self.observed.stop
        if stop is None or not stops(stop, kind):
            return None
        return refusal(stop)

    def refusal_for_batch(self, data: bytes) -> errors.WritesStopped | None:
        """The error a producer's record batch gets now (None: it may go): refused
        while a stop holds unless every message of it may pass. Its types are
        read from its framing only while a stop holds; a malformed batch goes on
        (the WAL refuses it, saying why)."""
        stop = self.observed.stop
        if stop is None:
            return None
        try:
            _header, outline = batch.outline(data)
        except errors.CorruptData:
            return None
        if any(stops(stop, MessageType(code)) for code in outline.type_codes):
            return refusal(stop)
        return None

    def refusals_for_batches(self, datas: Sequence[bytes]) -> dict[int, errors.WritesStopped]:
        """:meth:`refusal_for_batch` of each of ``datas`` that it refuses, by
        position: nothing to look at while no stop holds."""
        if self.observed.stop is None:
            return {}
        refused: dict[int, errors.WritesStopped] = {}
        for at, data in enumerate(datas):
            refusal = self.refusal_for_batch(data)
            if refusal is not None:
                refused[at] = refusal
        return refused

    @contextlib.contextmanager
    def appending(self, count: int) -> Iterator[None]:
        """Count ``count`` admitted messages as in flight while the block runs."""
        self.in_flight += count
        try:
            yield
        finally:
            self.in_flight -= count
            if self.observed.stop is not None:
                self.changed.set()

    def ack(self) -> WriteStopAck | None:
        """What the node reports now (None: no stop, nothing to report)."""
        observed = self.observed
        if observed.stop is None:
            return None
        return WriteStopAck(
            node=self.node_id,
            stop_revision=observed.revision,
            in_flight=self.in_flight,
            at=time.time(),
        )

    async def report(
        self,
        metastore: Metastore,
        keys: Keys,
        session_lease: Callable[[], int],
        *,
        retry_seconds: float = 0.5,
    ) -> None:
        """Publish the node's ack whenever it changes (runs until cancelled).
        Metastore failures are logged and retried; a new session's lease is
        picked up on the next write."""
        # (stop revision, in flight, lease) of the last ack written; None: none.
        written: tuple[int, int, int] | None = None
        self.changed.set()
        while True:
            await self.changed.wait()
            self.changed.clear()
            ack = self.ack()
            lease = session_lease()
            want = None if ack is None else (ack.stop_revision, ack.in_flight, lease)
            if want == written or (ack is not None and not lease):
                if ack is not None and not lease:
                    await self._later(retry_seconds)
                continue
            try:
                if ack is None:
                    await metastore.delete(ack_key(keys, self.node_id))
                else:
                    await metastore.put(ack_key(keys, self.node_id), ack.to_json(), lease=lease)
            except errors.HeadraceError as exc:
                log.warning("node %s: reporting the write stop failed: %s", self.node_id, exc)
                await self._later(retry_seconds)
                continue
            written = want

    async def _later(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.changed.set()
