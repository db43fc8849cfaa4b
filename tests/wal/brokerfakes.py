"""An in-memory broker for the broker toolkit's tests: a topic, links and sources.

A :class:`FakeTopic` behaves as the toolkit expects of a broker: a take by a
link fences the link that held the topic before. Hooks make the races that
real brokers show deterministic: a link fenced in the middle of a send
(:attr:`FakeTopic.fence_after`), a record in flight that lands before a new
fence record without a look at the end having seen it
(:attr:`FakeTopic.land_before_fence`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from headrace import errors
from headrace.wal.brokers.contract import EMPTY, Boundary, End, Lost, end_of
from headrace.wal.brokers.stamps import Kind, Stamp
from headrace.wal.brokers.testing import Parts
from headrace.wal.contract import Record, StartKind, StartPosition
from headrace.wal.memory.message_id import MemoryMessageID

FakeStamp = Stamp[MemoryMessageID]


class FakeLibraryError(Exception):
    """What the fake broker's client library raises."""


class Translations:
    """A boundary whose translations are counted."""

    def __init__(self) -> None:
        self.count = 0
        self.boundary = Boundary("fake", (FakeLibraryError,), self._translate)

    def _translate(self, exc: BaseException, what: str) -> errors.HeadraceError:
        self.count += 1
        return errors.Unavailable(f"fake {what}: {exc}")


class FakeTopic:
    def __init__(self, *, verifies: bool = False) -> None:
        self.records: list[tuple[MemoryMessageID, FakeStamp, bytes]] = []
        self.epoch = 0
        self.verifies = verifies
        """Whether links read back the range before their fence (as Pulsar's do)."""
        self.fence_after: int | None = None
        """Fence the sending link after this many more records are stored."""
        self.receipts_lost = 0
        """With ``fence_after``: this many more of the send's records are stored
        before the fence, their receipts lost with the producer."""
        self.land_before_fence: list[tuple[FakeStamp, bytes]] = []
        """Records in flight that are stored right before the next fence record."""
        self.takes = 0
        self.send_error: BaseException | None = None
        self.lock = threading.Lock()

    def append(self, stamp: FakeStamp, data: bytes) -> MemoryMessageID:
        mid = MemoryMessageID(len(self.records) + 1)
        self.records.append((mid, stamp, data))
        return mid


class FakeLink:
    def __init__(self, topic: FakeTopic, pchannel: str) -> None:
        self.pchannel = pchannel
        self.topic = f"fake.{pchannel}"
        self._topic = topic
        self._epoch: int | None = None
        self._unreported: list[tuple[MemoryMessageID, bytes]] = []
        self.released = False

    def look(self) -> End[MemoryMessageID]:
        with self._topic.lock:
            if not self._topic.records:
                return EMPTY
            mid, stamp, _ = self._topic.records[-1]
            return end_of(mid, stamp)

    def take(self) -> None:
        with self._topic.lock:
            topic = self._topic
            topic.epoch += 1
            topic.takes += 1
            self._epoch = topic.epoch

    def held(self) -> bool:
        return self._epoch is not None

    def send(self, records: Sequence[bytes], stamp: FakeStamp) -> list[MemoryMessageID]:
        with self._topic.lock:
            topic = self._topic
            if topic.send_error is not None:
                raise topic.send_error
            if stamp.kind is Kind.FENCE:
                for landed, data in topic.land_before_fence:
                    topic.append(landed, data)
                topic.land_before_fence = []
            written: list[MemoryMessageID] = []
            for position, data in enumerate(records):
                if topic.fence_after is not None and len(written) == topic.fence_after:
                    topic.fence_after = None
                    unreported = records[position : position + topic.receipts_lost]
                    self._unreported = [(topic.append(stamp, d), d) for d in unreported]
                    topic.epoch += 1
                if self._epoch != topic.epoch:
                    self._epoch = None
                    raise Lost(written)
                written.append(topic.append(stamp, data))
            return written

    def recovered(self, records: Sequence[bytes]) -> list[MemoryMessageID]:
        unreported, self._unreported = self._unreported, []
        ids: list[MemoryMessageID] = []
        for (mid, stored), data in zip(unreported, records, strict=False):
            if stored != data:
                break
            ids.append(mid)
        return ids

    def stored(
        self, after: MemoryMessageID | None, until: MemoryMessageID
    ) -> Sequence[tuple[MemoryMessageID, FakeStamp]] | None:
        if not self._topic.verifies:
            return None
        with self._topic.lock:
            return [
                (mid, stamp)
                for mid, stamp, _ in self._topic.records
                if (after is None or mid > after) and mid < until
            ]

    def drop(self) -> None:
        self._epoch = None

    def release(self) -> None:
        self._epoch = None
        self.released = True


class FakeSource:
    def __init__(self, topic: FakeTopic, start: StartPosition) -> None:
        self.topic = "fake.p"
        self._topic = topic
        self._start = start
        self._next = 0
        self.opened = False
        self.released = False
        self.fetch_error: BaseException | None = None
        self.open_error: BaseException | None = None

    def open(self) -> None:
        if self.open_error is not None:
            raise self.open_error
        self.opened = True
        with self._topic.lock:
            records = self._topic.records
            kind, mid = self._start.kind, self._start.id
            if kind is StartKind.LATEST:
                self._next = len(records)
            elif kind is not StartKind.EARLIEST:
                assert isinstance(mid, MemoryMessageID)
                after = kind is StartKind.AFTER
                self._next = next(
                    (i for i, r in enumerate(records) if r[0] > mid or (r[0] == mid and not after)),
                    len(records),
                )

    def fetch(self, max_records: int, wait_s: float) -> list[Record]:
        if self.fetch_error is not None:
            raise self.fetch_error
        with self._topic.lock:
            found = self._topic.records[self._next :]
        out: list[Record] = []
        for mid, stamp, data in found:
            if len(out) == max_records:
                break
            self._next += 1
            if stamp.kind is Kind.DATA:
                out.append(Record(mid, data))
        if not out:
            time.sleep(min(wait_s, 0.01))
        return out

    def release(self) -> None:
        self.released = True


def fake_parts(topics: dict[str, FakeTopic] | None = None) -> Parts[MemoryMessageID]:
    """The fake broker's parts for :func:`headrace.wal.brokers.testing.check_parts`."""
    known = {} if topics is None else topics

    def topic(pchannel: str) -> FakeTopic:
        return known.setdefault(pchannel, FakeTopic())

    return Parts(
        link=lambda pchannel: FakeLink(topic(pchannel), pchannel),
        source=lambda pchannel, start: FakeSource(topic(pchannel), start),
        boundary=Translations().boundary,
        library_error=lambda: FakeLibraryError("connection refused"),
    )
