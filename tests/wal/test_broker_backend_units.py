"""Pure parts of the Kafka and Pulsar backends: ids, stamps, fencing decisions, settings.

No broker is needed; the broker behaviour is covered by the conformance suite
and ``test_stale_writer_brokers.py``.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace import errors
from headrace.message import ids
from headrace.wal import registry
from headrace.wal.brokers.stamps import FOREIGN, Kind, Stamp
from headrace.wal.contract import StartPosition
from headrace.wal.kafka import fencing as kfence
from headrace.wal.kafka.backend import OFFSET_BEGINNING, start_offset
from headrace.wal.kafka.message_id import KafkaMessageID
from headrace.wal.kafka.settings import parse_settings as kafka_settings
from headrace.wal.pulsar import fencing as pfence
from headrace.wal.pulsar.client import next_position
from headrace.wal.pulsar.message_id import PulsarMessageID
from headrace.wal.pulsar.reader import first_wanted, is_gap
from headrace.wal.pulsar.settings import parse_settings as pulsar_settings

offsets = st.integers(min_value=0, max_value=(1 << 63) - 1)
ledgers = st.integers(min_value=0, max_value=(1 << 63) - 1)


@given(offsets)
def test_kafka_ids_round_trip(offset: int) -> None:
    mid = KafkaMessageID(offset)
    assert KafkaMessageID.from_bytes(mid.to_bytes()) == mid
    assert ids.parse(str(mid)) == mid
    assert ids.from_wire(ids.to_wire(mid)) == mid


@given(ledgers, ledgers, st.integers(-1, 100), st.integers(-1, 100))
def test_pulsar_ids_round_trip(ledger: int, entry: int, partition: int, batch: int) -> None:
    mid = PulsarMessageID(ledger, entry, partition, batch)
    assert PulsarMessageID.from_bytes(mid.to_bytes()) == mid
    assert ids.parse(str(mid)) == mid
    assert ids.from_wire(ids.to_wire(mid)) == mid


def test_pulsar_ids_order_by_ledger_entry_batch() -> None:
    assert str(PulsarMessageID(3, 7)) == "pulsar:3:7"
    assert PulsarMessageID(3, 7) < PulsarMessageID(3, 8) < PulsarMessageID(4, 0)
    assert PulsarMessageID(3, 7, 0, 1) < PulsarMessageID(3, 7, 0, 2)
    with pytest.raises(errors.InvalidArgument):
        _ = PulsarMessageID(1, 1) < KafkaMessageID(1)


@pytest.mark.parametrize("text", ["", "x", "1", "1:2:3", "1:-2", "a:b", "1.5:2"])
def test_pulsar_id_parse_errors(text: str) -> None:
    with pytest.raises(errors.InvalidArgument):
        PulsarMessageID.parse_value(text)


@pytest.mark.parametrize("text", ["", "-1", "x", str(1 << 63)])
def test_kafka_id_parse_errors(text: str) -> None:
    with pytest.raises(errors.InvalidArgument):
        KafkaMessageID.parse_value(text)


@given(st.integers(0, 1 << 40), st.integers(0, (1 << 63) - 1), st.integers(-1, 1 << 40))
def test_kafka_stamps_round_trip(term: int, nonce: int, prev: int) -> None:
    data: Stamp[KafkaMessageID] = Stamp(Kind.DATA, term, nonce)
    pointer = None if prev == -1 else KafkaMessageID(prev)
    fence = Stamp(Kind.FENCE, term, nonce, pointer)
    assert kfence.stamp_of(kfence.header(data)) == data
    assert kfence.stamp_of(kfence.header(fence)) == fence
    assert kfence.stamp_of(None) == FOREIGN
    assert kfence.stamp_of({"other": b"x"}) == FOREIGN


def test_kafka_stamp_encoding_is_unchanged() -> None:
    """The header bytes of format version 1, as written before the toolkit."""
    fence = Stamp(Kind.FENCE, 3, 5, KafkaMessageID(9))
    assert kfence.encode(fence) == bytes([1, 2]) + (3).to_bytes(8) + (5).to_bytes(8) + (9).to_bytes(
        8
    )
    empty: Stamp[KafkaMessageID] = Stamp(Kind.FENCE, 3, 5)
    assert kfence.encode(empty)[-8:] == b"\xff" * 8
    assert kfence.encode(Stamp(Kind.DATA, 3, 5)) == bytes([1, 1]) + (3).to_bytes(8) + (5).to_bytes(
        8
    )


def test_kafka_corrupt_stamp_is_reported() -> None:
    with pytest.raises(errors.CorruptData):
        kfence.decode(b"\x01\x09" + bytes(16))
    with pytest.raises(errors.CorruptData):
        kfence.stamp_of([(kfence.HEADER_NAME, b"short")])


def test_pulsar_stamps_round_trip_and_corruption() -> None:
    data: Stamp[PulsarMessageID] = Stamp(Kind.DATA, 4, 99)
    fence = Stamp(Kind.FENCE, 5, 7, PulsarMessageID(2, 3))
    empty: Stamp[PulsarMessageID] = Stamp(Kind.FENCE, 6, 8, None)
    for stamp in (data, fence, empty):
        assert pfence.stamp_of(pfence.properties(stamp)) == stamp
    assert pfence.properties(fence) == {pfence.PROPERTY: "f:5:7:2:3"}
    assert pfence.properties(data) == {pfence.PROPERTY: "d:4:99"}
    assert pfence.stamp_of({}) == FOREIGN
    for bad in ("d:x:1", "f:1:2", "q:1:2", "d:1:2:3"):
        with pytest.raises(errors.CorruptData):
            pfence.stamp_of({pfence.PROPERTY: bad})


def test_kafka_settings() -> None:
    settings = kafka_settings(
        {
            "bootstrap_servers": "127.0.0.1:9092",
            "cluster": "prod",
            "kafka": {"security.protocol": "SASL_SSL"},
            "kafka.sasl.password": "hunter2",
            "min_insync_replicas": 2,
        }
    )
    assert settings.topic("p0") == "headrace.prod.p0"
    assert settings.client == {"security.protocol": "SASL_SSL", "sasl.password": "hunter2"}
    producer = settings.producer_config("headrace.prod.p0")
    assert producer["transactional.id"] == "headrace-wal-headrace.prod.p0"
    assert producer["acks"] == "all" and producer["sasl.password"] == "hunter2"
    assert settings.consumer_config(eof=False)["isolation.level"] == "read_committed"
    assert settings.topic_config()["min.insync.replicas"] == "2"
    assert settings.topic_config()["retention.ms"] == "-1"
    assert settings.describe()["client"]["sasl.password"] == "***"


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"bootstrap_servers": ""},
        {"bootstrap_servers": "h:1", "colour": "red"},
        {"bootstrap_servers": "h:1", "kafka.transactional.id": "mine"},
        {"bootstrap_servers": "h:1", "kafka": {"isolation.level": "read_uncommitted"}},
        {"bootstrap_servers": "h:1", "replication_factor": 0},
        {"bootstrap_servers": "h:1", "timestamp_type": "Never"},
        {"bootstrap_servers": "h:1", "operation_timeout_s": -1},
    ],
)
def test_kafka_settings_refused(raw: dict[str, object]) -> None:
    with pytest.raises(errors.InvalidArgument):
        kafka_settings(raw)


@pytest.mark.parametrize("pchannel", ["", "has space", "slash/x", "x" * 300])
def test_kafka_topic_names_refused(pchannel: str) -> None:
    with pytest.raises(errors.InvalidArgument):
        kafka_settings({"bootstrap_servers": "h:1"}).topic(pchannel)


def test_pulsar_settings() -> None:
    settings = pulsar_settings(
        {"service_url": "pulsar://127.0.0.1:6650", "tenant": "t", "namespace": "ns"}
    )
    assert settings.topic("p0") == "persistent://t/ns/headrace.default.p0"
    assert settings.marks_topic("p0") == "persistent://t/ns/headrace.default.__truncation.p0"
    for bad in ("", "__x", "a/b"):
        with pytest.raises(errors.InvalidArgument):
            settings.topic(bad)
    for raw in (
        {},
        {"service_url": "http://x"},
        {"service_url": "pulsar://h:1", "pulsar.logger": None},
        {"service_url": "pulsar://h:1", "tenant": "a/b"},
        {"service_url": "pulsar://h:1", "unknown": 1},
    ):
        with pytest.raises(errors.InvalidArgument):
            pulsar_settings(raw)


def test_registry_reports_bad_settings_before_connecting() -> None:
    with pytest.raises(errors.InvalidArgument):
        registry.create("kafka")
    with pytest.raises(errors.InvalidArgument):
        registry.create("pulsar", service_url="nope")


def test_kafka_start_offsets() -> None:
    assert start_offset(StartPosition.earliest()) == OFFSET_BEGINNING
    assert start_offset(StartPosition.latest()) is None
    assert start_offset(StartPosition.at(KafkaMessageID(7))) == 7
    assert start_offset(StartPosition.after(KafkaMessageID(7))) == 8
    with pytest.raises(errors.InvalidArgument):
        start_offset(StartPosition.at(PulsarMessageID(1, 1)))


def test_pulsar_positions_and_gaps() -> None:
    mid = PulsarMessageID(5, 9)
    assert first_wanted(StartPosition.earliest()) is None
    assert first_wanted(StartPosition.at(mid)) == mid
    assert first_wanted(StartPosition.after(mid)) == PulsarMessageID(5, 10)
    assert next_position(mid) == PulsarMessageID(5, 10)
    assert not is_gap(None, mid)
    assert not is_gap(PulsarMessageID(5, 8), mid)
    assert is_gap(PulsarMessageID(5, 7), mid)
    assert is_gap(PulsarMessageID(4, 8), mid)
    with pytest.raises(errors.InvalidArgument):
        first_wanted(StartPosition.at(KafkaMessageID(1)))


@pytest.mark.parametrize("name", ["kafka", "pulsar"])
async def test_unreachable_broker_is_unavailable(name: str) -> None:
    from headrace_testbed.ports import free_port  # noqa: PLC0415

    address = f"127.0.0.1:{free_port()}"
    if name == "kafka":
        backend = registry.create("kafka", bootstrap_servers=address, operation_timeout_s=1.0)
    else:
        backend = registry.create(
            "pulsar", service_url=f"pulsar://{address}", operation_timeout_s=1.0
        )
    try:
        with pytest.raises(errors.Unavailable) as unavailable:
            await backend.open_writer("p0", 1)
        assert unavailable.value.retryable
        assert address in str(unavailable.value)
    finally:
        await backend.close()


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"kafka.security.protocol": "bogus"}, "security.protocol"),
        ({"kafka.linger.ms": "soon"}, "queue.buffering.max.ms"),
    ],
)
def test_kafka_client_setting_the_library_refuses_is_invalid_argument(
    setting: dict[str, str], named: str
) -> None:
    """librdkafka refuses the configuration when the backend makes its first client:
    a Headrace error naming the setting, not the library's exception."""
    with pytest.raises(errors.InvalidArgument) as refused:
        registry.create("kafka", bootstrap_servers="127.0.0.1:1", **setting)
    assert named in str(refused.value) and "127.0.0.1:1" in str(refused.value)
