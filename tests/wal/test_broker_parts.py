"""The broker toolkit's checks (headrace.wal.brokers.testing) on each real broker.

Each backend runs them in one line; ``kafka_parts`` and ``pulsar_parts`` hand
over the backend's link, source and error boundary, as its backend builds them.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from headrace.wal.brokers.testing import Parts, check_parts
from headrace.wal.contract import StartPosition
from headrace.wal.kafka.message_id import KafkaMessageID
from headrace.wal.pulsar.message_id import PulsarMessageID

pytestmark = pytest.mark.timeout(180)


def kafka_parts(bootstrap: str, *, chained: bool = False) -> Parts[KafkaMessageID]:
    from confluent_kafka import KafkaError, KafkaException  # noqa: PLC0415

    from headrace.wal.kafka import client  # noqa: PLC0415
    from headrace.wal.kafka.backend import start_offset  # noqa: PLC0415
    from headrace.wal.kafka.chain import ChainLink  # noqa: PLC0415
    from headrace.wal.kafka.reader import KafkaSource  # noqa: PLC0415
    from headrace.wal.kafka.settings import parse_settings  # noqa: PLC0415
    from headrace.wal.kafka.writer import KafkaLink  # noqa: PLC0415

    prefix = f"parts.{uuid.uuid4().hex[:12]}."
    settings = parse_settings({"bootstrap_servers": bootstrap, "topic_prefix": prefix})
    admin = client.new_admin(settings)

    def link(pchannel: str) -> KafkaLink | ChainLink:
        client.ensure_topic(admin, settings, settings.topic(pchannel))
        kind = ChainLink if chained else KafkaLink
        return kind(settings, pchannel, settings.topic(pchannel))

    def source(pchannel: str, start: StartPosition) -> KafkaSource:
        return KafkaSource(settings, settings.topic(pchannel), start_offset(start))

    return Parts(
        link=link,
        source=source,
        boundary=client.boundary(settings),
        library_error=lambda: KafkaException(KafkaError(KafkaError._TRANSPORT)),
        displaced_by_fenced=chained,
    )


def pulsar_parts(url: str) -> Parts[PulsarMessageID]:
    import pulsar  # noqa: PLC0415

    from headrace.wal.pulsar import client  # noqa: PLC0415
    from headrace.wal.pulsar.reader import PulsarSource  # noqa: PLC0415
    from headrace.wal.pulsar.settings import parse_settings  # noqa: PLC0415
    from headrace.wal.pulsar.writer import PulsarLink  # noqa: PLC0415

    prefix = f"parts.{uuid.uuid4().hex[:12]}."
    settings = parse_settings({"service_url": url, "topic_prefix": prefix})
    shared = client.new_client(settings)

    def link(pchannel: str) -> PulsarLink:
        client.ensure_topics(shared, settings, pchannel)
        return PulsarLink(settings, pchannel, 1)

    def source(pchannel: str, start: StartPosition) -> PulsarSource:
        return PulsarSource(settings, shared, pchannel, start)

    return Parts(
        link=link,
        source=source,
        boundary=client.boundary(settings),
        library_error=lambda: pulsar.Timeout("no answer"),
        close=shared.close,
    )


@pytest.mark.kafka
async def test_kafka_parts(kafka_bootstrap: str) -> None:
    await asyncio.to_thread(check_parts, kafka_parts(kafka_bootstrap))


@pytest.mark.kafka
async def test_kafka_chained_parts(kafka_bootstrap: str) -> None:
    await asyncio.to_thread(check_parts, kafka_parts(kafka_bootstrap, chained=True))


@pytest.mark.pulsar
async def test_pulsar_parts(pulsar_url: str) -> None:
    await asyncio.to_thread(check_parts, pulsar_parts(pulsar_url))
