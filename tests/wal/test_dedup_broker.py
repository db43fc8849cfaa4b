"""On a real broker: a stall during the dedup rebuild fails the open, never a partial window.

The broker is stopped (SIGSTOP) from the moment the rebuild's reader is open
until its first read returns, so that read times out and everything else of
the open works: an open that took the timed-out read for the end of the log
would serve and write a retried message a second time.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable

import pytest

from headrace import errors
from headrace.bench.broker_faults import BrokerControl
from headrace.message import codec
from headrace.message.types import Message, MessageType
from headrace.tso import LocalTSO
from headrace.wal import registry
from headrace.wal.api import WALState
from headrace.wal.contract import Backend, BackendReader, Record, StartPosition
from headrace.wal.framework import WAL, WALOptions
from tests.wal.delegating import DelegatingBackend

QUIET = WALOptions(timetick_interval_ms=3_600_000)
_STALL_ATTEMPTS = 6
_BROKERS = {
    "kafka": ("kafka_bootstrap", "bootstrap_servers"),
    "pulsar": ("pulsar_url", "service_url"),
}


def produced(payload: bytes, producer: str, seq: int) -> Message:
    return Message(
        MessageType.INSERT, "v", payload, {"producer_id": producer, "producer_seq": str(seq)}
    )


class StallFirstRead(DelegatingBackend):
    """The broker is stopped as soon as the first reader is open, until that
    reader's first read returns; ``landed`` tells whether the stall took
    effect: that read got nothing (or failed), rather than records the client
    library had already fetched ahead while the reader was being opened."""

    def __init__(self, inner: Backend, broker: BrokerControl) -> None:
        super().__init__(inner)
        self.broker = broker
        self.stalls = 1
        self.landed: bool | None = None
        """None: no stalled read happened (yet)."""

    async def open_reader(self, pchannel: str, start: StartPosition) -> BackendReader:
        reader = await self.inner.open_reader(pchannel, start)
        if self.stalls == 0:
            return reader
        self.stalls = 0
        pid = self.broker.pid()
        os.kill(pid, signal.SIGSTOP)
        return _StallingReader(self, reader, pid)


class _StallingReader(BackendReader):
    def __init__(self, owner: StallFirstRead, inner: BackendReader, stopped: int | None) -> None:
        self._owner = owner
        self._inner = inner
        self._stopped = stopped
        """The broker process stopped until the first read returns."""

    async def next_batch(
        self, max_records: int = 1024, timeout: float | None = None
    ) -> list[Record]:
        pid, self._stopped = self._stopped, None
        if pid is None:
            return await self._inner.next_batch(max_records, timeout)
        self._owner.landed = True
        try:
            records = await self._inner.next_batch(max_records, timeout)
        finally:
            os.kill(pid, signal.SIGCONT)
        self._owner.landed = not records
        return records

    async def close(self) -> None:
        if self._stopped is not None:
            os.kill(self._stopped, signal.SIGCONT)
            self._stopped = None
        await self._inner.close()


async def copies(backend: Backend, payload: bytes) -> int:
    reader = await backend.open_reader("p", StartPosition.earliest())
    last = await backend.last_record("p")
    found = 0
    seen = None
    while last is not None and (seen is None or seen < last.id):
        records = await reader.next_batch(1024, timeout=10)
        assert records, "the log did not deliver up to its last record"
        found += sum(codec.decode(r.data).payload == payload for r in records)
        seen = records[-1].id
    await reader.close()
    return found


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "kind", [pytest.param(name, marks=getattr(pytest.mark, name)) for name in _BROKERS]
)
async def test_a_broker_stalled_during_the_rebuild_fails_the_open_and_a_retry_catches_the_repeat(
    kind: str, request: pytest.FixtureRequest, broker_control: Callable[[str], BrokerControl]
) -> None:
    fixture, setting = _BROKERS[kind]
    settings = {
        setting: request.getfixturevalue(fixture),
        "topic_prefix": f"stall.{uuid.uuid4().hex[:12]}.",
        "operation_timeout_s": 10.0,
    }
    backend = registry.create(kind, **settings)
    wal1 = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    original = await wal1.append(produced(b"x", "prod", 1))
    for result in await wal1.append_many([produced(b"f%d" % i, "prod", 2 + i) for i in range(20)]):
        assert not isinstance(result, errors.HeadraceError), result
    control = broker_control(kind)
    # The client library may fetch the whole (small) log ahead while the
    # reader is being opened, before the stop: that read then succeeds without
    # the broker and the open rightly serves. Try again (a higher term) until
    # the stall lands on a read; an open that serves after a landed stall took
    # an empty read for the end of the log.
    term = 2
    for term in range(2, 2 + _STALL_ATTEMPTS):
        stalling = StallFirstRead(backend, control)
        try:
            served = await WAL.open(stalling, "p", term, tso=LocalTSO(), options=QUIET)
        except errors.HeadraceError as exc:
            assert exc.retryable, exc
            assert stalling.landed, f"the open failed though no read was stalled: {exc!r}"
            break
        assert stalling.landed is False, (
            "the open served after a read that got nothing from the stopped broker"
        )
        await served.close()
    else:
        pytest.fail(f"the stall never landed on a read in {_STALL_ATTEMPTS} opens")
    wal3 = await WAL.open(stalling, "p", term + 1, tso=LocalTSO(), options=QUIET)
    assert wal3.state is WALState.SERVING
    assert await wal3.append(produced(b"x", "prod", 1)) == original
    assert await copies(backend, b"x") == 1
    await wal3.close()
    await wal1.close()
    await backend.close()
