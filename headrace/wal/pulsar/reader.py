"""The Pulsar reader's source: the Reader API from a message id, fence records skipped.

Pulsar drops whole ledgers behind the ``headrace-truncation`` subscription and
a reader does not notice: it just continues at the next ledger it finds. So
the reader keeps the truncation point it knows; reads that start below it
raise ``Truncated``, and whenever the ids jump (another ledger, or entries
missing) it reloads the point and raises ``Truncated`` if it lies beyond the
last message this reader delivered. The reader's lifecycle is the toolkit's
(:class:`headrace.wal.brokers.reader.BrokerReader`).
"""

from __future__ import annotations

from typing import Any

import pulsar

from headrace import errors
from headrace.wal.brokers.plumbing import expect_id
from headrace.wal.brokers.stamps import Kind
from headrace.wal.contract import Record, StartKind, StartPosition
from headrace.wal.pulsar import client
from headrace.wal.pulsar.message_id import PulsarMessageID
from headrace.wal.pulsar.settings import PulsarSettings


def _as_id(mid: object) -> PulsarMessageID:
    return expect_id(mid, PulsarMessageID)


def first_wanted(start: StartPosition) -> PulsarMessageID | None:
    """The smallest id a reader from ``start`` may deliver, if it names one (pure)."""
    if start.kind is StartKind.AT:
        return _as_id(start.id)
    if start.kind is StartKind.AFTER:
        mid = _as_id(start.id)
        return PulsarMessageID(mid.ledger, mid.entry + 1)
    return None


def is_gap(previous: PulsarMessageID | None, current: PulsarMessageID) -> bool:
    """Whether messages may be missing between two consecutive deliveries (pure)."""
    if previous is None:
        return False
    return current.ledger != previous.ledger or current.entry > previous.entry + 1


class PulsarSource:
    """A :class:`~headrace.wal.brokers.contract.Source` of a pchannel from ``start``."""

    def __init__(
        self,
        settings: PulsarSettings,
        pulsar_client: pulsar.Client,
        pchannel: str,
        start: StartPosition,
    ) -> None:
        self.pchannel = pchannel
        self._settings = settings
        self._client = pulsar_client
        self.topic = settings.topic(pchannel)
        self._start = start
        self._reader: Any = None
        self._mark: PulsarMessageID | None = None
        self._last: PulsarMessageID | None = None
        self._truncated: errors.Truncated | None = None

    def open(self) -> None:
        start = self._start
        self._mark = client.read_mark(self._client, self._settings, self.pchannel)
        wanted = first_wanted(start)
        if wanted is not None and self._mark is not None and wanted < self._mark:
            self._truncated = self._truncated_error(wanted)
            return
        inclusive = True
        if start.kind is StartKind.EARLIEST:
            position = (
                pulsar.MessageId.earliest if self._mark is None else client.to_pulsar(self._mark)
            )
        elif start.kind is StartKind.LATEST:
            position, inclusive = pulsar.MessageId.latest, False
        else:
            mid = _as_id(start.id)
            position, inclusive = client.to_pulsar(mid), start.kind is StartKind.AT
        try:
            self._reader = self._client.create_reader(
                self.topic, position, start_message_id_inclusive=inclusive
            )
        except pulsar.PulsarException as exc:
            raise client.translate(
                exc, f"opening a reader of {self.topic}", self._settings
            ) from None
        if start.kind is StartKind.AFTER:
            self._last = _as_id(start.id)
        elif wanted is not None and wanted.entry > 0:
            self._last = PulsarMessageID(wanted.ledger, wanted.entry - 1)

    def _truncated_error(self, position: PulsarMessageID) -> errors.Truncated:
        earliest = str(self._mark) if self._mark is not None else ""
        return errors.Truncated(
            f"pulsar: {self.topic} was truncated before {earliest}; {position} is no longer "
            "readable",
            earliest=earliest,
        )

    def fetch(self, max_records: int, wait_s: float) -> list[Record]:
        if self._truncated is not None:
            raise self._truncated
        records: list[Record] = []
        message = self._read(int(wait_s * 1000))
        while message is not None:
            record = self._accept(message)
            if self._truncated is not None:
                break
            if record is not None:
                records.append(record)
            if len(records) >= max_records:
                break
            message = self._read(0)
        if records:
            return records
        if self._truncated is not None:
            raise self._truncated
        return []

    def _read(self, timeout_ms: int) -> pulsar.Message | None:
        try:
            message: pulsar.Message = self._reader.read_next(timeout_ms)
            return message
        except pulsar.Timeout:
            return None
        except pulsar.PulsarException as exc:
            raise client.translate(exc, f"reading {self.topic}", self._settings) from None

    def _accept(self, message: pulsar.Message) -> Record | None:
        mid = client.from_pulsar(message.message_id())
        if is_gap(self._last, mid):
            self._mark = client.read_mark(self._client, self._settings, self.pchannel)
            if self._mark is not None and self._last is not None and self._mark > self._last:
                self._truncated = self._truncated_error(self._last)
                return None
        self._last = mid
        if client.stamp(message).kind is not Kind.DATA:
            return None
        return Record(mid, message.data())

    def release(self) -> None:
        reader, self._reader = self._reader, None
        client.close_quietly(reader, f"a reader of {self.topic}")
