"""Message ids with a batch index, for every registered backend id class:
printed and wire forms, parsing, order, equality, pickling, ``preceding``."""

from __future__ import annotations

import copy
import pickle
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace import errors
from headrace.message import ids
from headrace.wal.kafka.message_id import KafkaMessageID
from headrace.wal.local.message_id import LocalMessageID
from headrace.wal.memory.message_id import MemoryMessageID
from headrace.wal.pulsar.message_id import PulsarMessageID

U64 = st.integers(0, 2**64 - 1)
INDEXES = st.integers(0, 2**32 - 1)
RECORDS: dict[str, st.SearchStrategy[ids.MessageID]] = {
    "local": st.builds(LocalMessageID, U64),
    "memory": st.builds(MemoryMessageID, U64),
    "kafka": st.builds(KafkaMessageID, st.integers(0, 2**63 - 1)),
    "pulsar": st.builds(
        PulsarMessageID,
        st.integers(0, 2**63 - 1),
        st.integers(0, 2**63 - 1),
        st.integers(-1, 2**31 - 1),
        st.integers(-1, 2**31 - 1),
    ),
}
SAMPLES: dict[str, ids.MessageID] = {
    "local": LocalMessageID(42),
    "memory": MemoryMessageID(42),
    "kafka": KafkaMessageID(42),
    "pulsar": PulsarMessageID(12, 42),
}


def test_every_registered_backend_is_covered() -> None:
    assert {cls.backend for cls in ids.registered()} == set(RECORDS)
    assert {type(mid) for mid in SAMPLES.values()} == set(ids.registered())


@pytest.mark.parametrize("backend", sorted(RECORDS))
@given(data=st.data(), index=INDEXES)
def test_round_trips_keep_the_index(backend: str, data: st.DataObject, index: int) -> None:
    record = data.draw(RECORDS[backend])
    mid = record.with_index(index)
    assert mid.index == index
    assert type(mid) is type(record)
    assert mid.record_id() == record
    assert mid.record_id().index == 0
    for copied in (
        ids.parse(str(mid)),
        ids.from_wire(ids.to_wire(mid)),
        pickle.loads(pickle.dumps(mid)),
        copy.deepcopy(mid),
    ):
        assert copied == mid
        assert copied.index == index
        assert hash(copied) == hash(mid)
        assert str(copied) == str(mid)
    if index:
        assert str(mid) == f"{backend}:{record.value_str()}/{index}"
    else:
        assert str(mid) == f"{backend}:{record.value_str()}"


@pytest.mark.parametrize("backend", sorted(RECORDS))
@given(data=st.data())
def test_index_zero_forms_are_unchanged(backend: str, data: st.DataObject) -> None:
    """The printed and wire forms of a record id are what they were before ids
    had an index, so everything stored or printed before parses the same."""
    record = data.draw(RECORDS[backend])
    assert "/" not in record.value_str()
    assert str(record) == f"{backend}:{record.value_str()}"
    assert ids.to_wire(record) == backend.encode() + b"\0" + record.to_bytes()
    assert record.with_index(0) is record
    assert record.record_id() is record


def test_wire_bytes_written_before_the_index_still_read() -> None:
    old = b"local\x00\x00\x00\x00\x00\x00\x00\x00\x2a"
    assert ids.from_wire(old) == LocalMessageID(42)
    assert ids.from_wire(old).index == 0
    assert ids.to_wire(LocalMessageID(42)) == old
    pulsar_old = b"pulsar\x00" + struct.pack(">qqii", 12, 1, -1, -1)
    assert ids.from_wire(pulsar_old) == PulsarMessageID(12, 1)
    assert ids.to_wire(PulsarMessageID(12, 1)) == pulsar_old


def test_wire_form_with_an_index() -> None:
    wire = b"local\x01\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x2a"
    assert ids.to_wire(LocalMessageID(42).with_index(3)) == wire
    assert ids.from_wire(wire) == LocalMessageID(42).with_index(3)
    # Value bytes holding 0x00 and 0x01 do not confuse the separator.
    pulsar = PulsarMessageID(1, 256, 1, 0).with_index(2**32 - 1)
    assert ids.to_wire(pulsar) == b"pulsar\x01\xff\xff\xff\xff" + pulsar.to_bytes()
    assert ids.from_wire(ids.to_wire(pulsar)) == pulsar


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"local", "no backend name"),
        (b"", "no backend name"),
        (b"local\x01", "truncated index (0 of 4 bytes"),
        (b"local\x01\x00\x00\x03", "truncated index (3 of 4 bytes"),
        (b"local\x01\x00\x00\x00\x03", "local message id must be 8 bytes, got 0"),
        (b"local\x01\x00\x00\x00\x03\x00\x2a", "local message id must be 8 bytes, got 2"),
        (b"local\x00\x00\x2a", "local message id must be 8 bytes, got 2"),
        (b"nope\x01\x00\x00\x00\x03", "unknown message id backend"),
    ],
)
def test_malformed_wire_forms_are_rejected(data: bytes, message: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=message.replace("(", r"\(")):
        ids.from_wire(data)


def test_order_puts_the_index_after_the_record() -> None:
    r42, r43 = LocalMessageID(42), LocalMessageID(43)
    m1, m2 = r42.with_index(1), r42.with_index(2)
    assert r42 < m1 < m2 < r43
    assert sorted([r43, m2, r42, m1]) == [r42, m1, m2, r43]
    assert m2 > m1 >= r42 and r42 <= m1 and m1 >= LocalMessageID(42).with_index(1)
    assert max(m2, r43) == r43
    p = PulsarMessageID(12, 0)
    assert p < p.with_index(1) < PulsarMessageID(12, 0, -1, 0) < PulsarMessageID(12, 1)


@pytest.mark.parametrize("backend", sorted(RECORDS))
@given(data=st.data(), i=INDEXES, j=INDEXES)
def test_order_and_equality_follow_record_then_index(
    backend: str, data: st.DataObject, i: int, j: int
) -> None:
    a = data.draw(RECORDS[backend]).with_index(i)
    b = data.draw(RECORDS[backend]).with_index(j)
    key_a, key_b = (a.sort_key(), a.index), (b.sort_key(), b.index)
    assert (a < b) == (key_a < key_b)
    assert (a == b) == (key_a == key_b)
    if a == b:
        assert hash(a) == hash(b)


@pytest.mark.parametrize("backend", sorted(SAMPLES))
def test_ids_differing_only_in_index_are_distinct(backend: str) -> None:
    record = SAMPLES[backend]
    first = record.with_index(1)
    assert record != first
    assert first != record.with_index(2)
    assert first == record.with_index(1)
    assert hash(first) == hash(record.with_index(1))
    assert len({record, first, record.with_index(1), record.with_index(2)}) == 3
    assert {first: "x"}[ids.parse(str(first))] == "x"
    assert first.with_index(0) == record
    assert first.with_index(1) is first


@pytest.mark.parametrize("backend", sorted(SAMPLES))
@pytest.mark.parametrize("count", [0, 1, 5, 41, 42, 43, 1000])
def test_preceding_counts_records_of_the_record_id(backend: str, count: int) -> None:
    record = SAMPLES[backend]
    before = record.with_index(7).preceding(count)
    assert before == record.preceding(count)
    if before is not None:
        assert before.index == 0
        assert before <= record.with_index(7)


@pytest.mark.parametrize("index", [-1, 2**32, 2**40, True])
def test_out_of_range_indexes_are_rejected(index: int) -> None:
    with pytest.raises(errors.InvalidArgument, match="index out of range"):
        LocalMessageID(42).with_index(index)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("local:42/x", "the index after '/' must be a decimal number"),
        ("local:42/", "the index after '/' must be a decimal number"),
        ("local:42/-1", "the index after '/' must be a decimal number"),
        ("local:42/+1", "the index after '/' must be a decimal number"),
        ("local:42/ 1", "the index after '/' must be a decimal number"),
        ("local:42/1/2", "the index after '/' must be a decimal number"),
        ("local:42/\u0661", "the index after '/' must be a decimal number"),
        ("local:42/4294967296", "index 4294967296 is not below 2"),
        ("pulsar:12:0/x", "the index after '/' must be a decimal number"),
        ("local:/3", "malformed local message id value ''"),
        ("local:x/3", "malformed local message id value 'x'"),
        ("nope:42/3", "unknown message id backend"),
        ("42/3", "expected '<backend>:<value>'"),
    ],
)
def test_malformed_printed_forms_are_rejected(text: str, message: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=message):
        ids.parse(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("local:42", LocalMessageID(42)),
        ("local:42/3", LocalMessageID(42).with_index(3)),
        ("local:42/0", LocalMessageID(42)),
        ("local:42/4294967295", LocalMessageID(42).with_index(2**32 - 1)),
        ("kafka:7/1", KafkaMessageID(7).with_index(1)),
        ("memory:0/9", MemoryMessageID(0).with_index(9)),
        ("pulsar:12:0", PulsarMessageID(12, 0)),
        ("pulsar:12:0/2", PulsarMessageID(12, 0).with_index(2)),
        ("pulsar:12:0:-1:3", PulsarMessageID(12, 0, -1, 3)),
        ("pulsar:12:0:-1:3/2", PulsarMessageID(12, 0, -1, 3).with_index(2)),
    ],
)
def test_printed_forms_parse(text: str, expected: ids.MessageID) -> None:
    parsed = ids.parse(text)
    assert parsed == expected
    assert parsed.index == expected.index


def test_with_index_keeps_every_field_of_the_record() -> None:
    mid = PulsarMessageID(12, 5, 3, 4).with_index(6)
    assert (mid.ledger, mid.entry, mid.partition, mid.batch, mid.index) == (12, 5, 3, 4, 6)
    assert mid.record_id().to_bytes() == PulsarMessageID(12, 5, 3, 4).to_bytes()


def test_id_classes_must_declare_slots() -> None:
    with pytest.raises(TypeError, match="must declare __slots__"):

        class _NoSlots(LocalMessageID):
            pass


@pytest.mark.parametrize("backend", sorted(RECORDS))
@given(data=st.data(), count=st.integers(0, 40), start=st.integers(0, 5))
def test_indexed_gives_each_message_id_of_the_record(
    backend: str, data: st.DataObject, count: int, start: int
) -> None:
    record = data.draw(RECORDS[backend])
    made = record.with_index(start).indexed(count)
    expected = [record.with_index(i) for i in range(count)]
    assert made == expected
    assert [mid.index for mid in made] == list(range(count))
    assert [str(mid) for mid in made] == [str(mid) for mid in expected]
    assert [hash(mid) for mid in made] == [hash(mid) for mid in expected]
    assert [ids.to_wire(mid) for mid in made] == [ids.to_wire(mid) for mid in expected]
    assert sorted(reversed(made)) == expected
    for mid in made:
        assert type(mid) is type(record)
        assert mid.record_id() == record
        assert mid.to_bytes() == record.to_bytes()
        assert pickle.loads(pickle.dumps(mid)) == mid
        assert copy.deepcopy(mid).index == mid.index


def test_indexed_copies_the_slots_of_every_class_of_the_id() -> None:
    class _Tagged(PulsarMessageID):
        __slots__ = ("tag",)

        def __init__(self, ledger: int, entry: int, tag: str) -> None:
            super().__init__(ledger, entry, 3, 4)
            self.tag = tag

    made = _Tagged(12, 5, "t").with_index(2).indexed(3)
    assert [(m.ledger, m.entry, m.partition, m.batch, m.tag, m.index) for m in made] == [
        (12, 5, 3, 4, "t", i) for i in range(3)
    ]
    assert made[0].index == 0
    assert "index" not in vars(made[0])


@pytest.mark.parametrize("count", [-1, 2**32 + 1, True, 2.0])
def test_indexed_rejects_counts_out_of_range(count: int) -> None:
    with pytest.raises(errors.InvalidArgument, match="count out of range"):
        LocalMessageID(1).indexed(count)


def test_id_classes_must_name_their_slots_plainly() -> None:
    with pytest.raises(TypeError, match="must be plain attribute names"):

        class _Private(LocalMessageID):
            __slots__ = ("__hidden",)
