"""Backends for the WAL conformance suite.

``BACKENDS`` maps a backend name to an async factory of a :class:`BackendCase`
over fresh storage; adding a backend to every conformance test is one entry
there (real brokers add a marker in ``MARKS``).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from headrace.message import ids
from headrace.message.ids import MessageID
from headrace.wal import registry
from headrace.wal.contract import Backend
from headrace.wal.memory import MemoryBackend, MemoryStore


def dense_next(mid: MessageID) -> MessageID:
    """The id right after ``mid`` for backends whose ids count records."""
    return ids.parse(f"{mid.backend}:{int(mid.value_str()) + 1}")


@dataclasses.dataclass
class BackendCase:
    """Opens clients (backend instances) of one storage; closes them at teardown."""

    name: str
    open_backend: Callable[[], Awaitable[Backend]]
    next_id: Callable[[MessageID], MessageID] = dense_next
    """An id above ``mid`` and at most the id of the next record appended."""
    id_between: Callable[[MessageID, MessageID], MessageID | None] | None = None
    """An id strictly between two consecutive records, for backends with gaps."""
    exact_truncation: bool = True
    """Whether ``truncate`` drops exactly what it is asked to (not more kept)."""
    opened: list[Backend] = dataclasses.field(default_factory=list)

    async def __call__(self) -> Backend:
        backend = await self.open_backend()
        self.opened.append(backend)
        return backend

    async def close_all(self) -> None:
        for backend in self.opened:
            await backend.close()


async def memory_case(tmp_path: Path) -> BackendCase:
    store = MemoryStore()

    async def open_backend() -> Backend:
        return MemoryBackend(store)

    return BackendCase("memory", open_backend)


async def local_case(tmp_path: Path) -> BackendCase:
    root = str(tmp_path / "wal")

    async def open_backend() -> Backend:
        return registry.create("local", root=root)

    return BackendCase("local", open_backend)


async def kafka_case(tmp_path: Path) -> BackendCase:
    from headrace.wal.kafka.message_id import KafkaMessageID  # noqa: PLC0415
    from tests.fixtures_brokers import kafka_bootstrap_address  # noqa: PLC0415

    def between(low: MessageID, high: MessageID) -> MessageID | None:
        assert isinstance(low, KafkaMessageID) and isinstance(high, KafkaMessageID)
        return KafkaMessageID(low.offset + 1) if high.offset > low.offset + 1 else None

    settings = {"bootstrap_servers": kafka_bootstrap_address(), "topic_prefix": _broker_prefix()}

    async def open_backend() -> Backend:
        return registry.create("kafka", **settings)

    return BackendCase("kafka", open_backend, id_between=between)


async def kafka_chained_case(tmp_path: Path) -> BackendCase:
    """Kafka with the writer of message format 2 logs (chained, no transactions)."""
    from tests.wal.delegating import FormatBackend  # noqa: PLC0415

    case = await kafka_case(tmp_path)
    transactional = case.open_backend

    async def open_backend() -> Backend:
        return FormatBackend(await transactional(), 2)

    return dataclasses.replace(case, name="kafka-chained", open_backend=open_backend)


async def pulsar_case(tmp_path: Path) -> BackendCase:
    from headrace.wal.pulsar.message_id import PulsarMessageID  # noqa: PLC0415
    from tests.fixtures_brokers import pulsar_service_url  # noqa: PLC0415

    def next_id(mid: MessageID) -> MessageID:
        assert isinstance(mid, PulsarMessageID)
        return PulsarMessageID(mid.ledger, mid.entry + 1)

    settings = {"service_url": pulsar_service_url(), "topic_prefix": _broker_prefix()}

    async def open_backend() -> Backend:
        return registry.create("pulsar", **settings)

    return BackendCase("pulsar", open_backend, next_id=next_id)


def _broker_prefix() -> str:
    """A topic prefix no other test uses (the session's brokers are shared)."""
    return f"conf.{uuid.uuid4().hex[:12]}."


BACKENDS: dict[str, Callable[[Path], Awaitable[BackendCase]]] = {
    "memory": memory_case,
    "local": local_case,
    "kafka": kafka_case,
    "kafka-chained": kafka_chained_case,
    "pulsar": pulsar_case,
}
MARKS: dict[str, pytest.MarkDecorator] = {
    "kafka": pytest.mark.kafka,
    "kafka-chained": pytest.mark.kafka,
    "pulsar": pytest.mark.pulsar,
}


@pytest.fixture(params=[pytest.param(name, marks=MARKS.get(name, ())) for name in BACKENDS])
async def backend_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[BackendCase]:
    case = await BACKENDS[request.param](tmp_path)
    yield case
    await case.close_all()


@pytest.fixture
def pchannel() -> str:
    """A pchannel name no other test uses (real brokers are shared)."""
    return f"conf-{uuid.uuid4().hex[:10]}"
