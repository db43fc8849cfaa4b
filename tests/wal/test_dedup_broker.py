"""On a real broker: a stall during the dedup rebuild fails the open, never a partial window.

The broker is stopped (SIGSTOP) for the first read of the rebuild only, so
that read times out and everything else of the open works: an open that took
the timed-out read for the end of the log would serve and write a retried
message a second time.
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
_BROKERS = {
    "kafka": ("kafka_bootstrap", "bootstrap_servers"),
    "pulsar": ("pulsar_url", "service_url"),
}


def produced(payload: bytes, producer: str, seq: int) -> Message:
    return Message(
        MessageType.INSERT, "v", payload, {"producer_id": producer, "producer_seq": str(seq)}
    )


class StallFirstRead(DelegatingBackend):
    """The first read of the first reader runs while the broker is stopped."""

    def __init__(self, inner: Backend, broker: BrokerControl) -> None:
        super().__init__(inner)
        self.broker = broker
        self.stalls = 1

    async def open_reader(self, pchannel: str, start: StartPosition) -> BackendReader:
        return _StallingReader(self, await self.inner.open_reader(pchannel, start))


class _StallingReader(BackendReader):
    def __init__(self, owner: StallFirstRead, inner: BackendReader) -> None:
        self._owner = owner
        self._inner = inner

    async def next_batch(
        self, max_records: int = 1024, timeout: float | None = None
    ) -> list[Record]:
        owner = self._owner
        if owner.stalls == 0:
            return await self._inner.next_batch(max_records, timeout)
        owner.stalls -= 1
        pid = owner.broker.pid()
        os.kill(pid, signal.SIGSTOP)
        try:
            return await self._inner.next_batch(max_records, timeout)
        finally:
            os.kill(pid, signal.SIGCONT)

    async def close(self) -> None:
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
    stalling = StallFirstRead(backend, broker_control(kind))
    with pytest.raises(errors.HeadraceError) as failed:
        await WAL.open(stalling, "p", 2, tso=LocalTSO(), options=QUIET)
    assert failed.value.retryable, failed.value
    wal3 = await WAL.open(stalling, "p", 3, tso=LocalTSO(), options=QUIET)
    assert wal3.state is WALState.SERVING
    assert await wal3.append(produced(b"x", "prod", 1)) == original
    assert await copies(backend, b"x") == 1
    await wal3.close()
    await wal1.close()
    await backend.close()
