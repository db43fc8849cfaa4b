"""The results of a record batch's messages (``BatchAppendResult``): the
same values, types and behaviour as results built one by one."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.message.ids import MessageID
from headrace.wal.api import AppendResult, BatchAppendResult
from headrace.wal.kafka.message_id import KafkaMessageID
from headrace.wal.local.message_id import LocalMessageID
from headrace.wal.pulsar.message_id import PulsarMessageID

RECORDS = st.one_of(
    st.builds(LocalMessageID, st.integers(0, 2**64 - 1)),
    st.builds(KafkaMessageID, st.integers(0, 2**63 - 1)),
    st.builds(PulsarMessageID, st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1)),
)


def one_by_one(batch: BatchAppendResult) -> list[AppendResult]:
    rid = batch.record_id
    return [
        AppendResult(rid.with_index(i), batch.timetick + i, batch.term, batch.txn_id)
        for i in range(batch.count)
    ]


@given(
    record=RECORDS,
    count=st.integers(1, 300),
    timetick=st.integers(0, 2**63),
    term=st.integers(0, 2**32),
    txn_id=st.integers(0, 2**64 - 1),
)
def test_results_are_those_built_one_by_one(
    record: MessageID, count: int, timetick: int, term: int, txn_id: int
) -> None:
    batch = BatchAppendResult(record, count, timetick, term, txn_id)
    results = batch.results()
    expected = one_by_one(batch)
    assert results == expected
    assert [hash(r) for r in results] == [hash(r) for r in expected]
    assert [repr(r) for r in results] == [repr(r) for r in expected]
    assert [str(r.id) for r in results] == [str(r.id) for r in expected]
    assert batch.message_ids() == [r.id for r in expected]
    assert results[0] == batch.first()
    assert all(type(r) is AppendResult for r in results)


def test_results_keep_the_frozen_dataclass_behaviour() -> None:
    results = BatchAppendResult(LocalMessageID(7), 3, 100, 2, 9).results()
    assert str(results[2].id) == "local:7/2"
    assert (results[2].timetick, results[2].term, results[2].txn_id) == (102, 2, 9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        results[1].timetick = 5  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(results)) == results
    assert copy.deepcopy(results) == results
    assert dataclasses.replace(results[1], term=3) == AppendResult(
        LocalMessageID(7).with_index(1), 101, 3, 9
    )
    assert dataclasses.astuple(results[0])[1:] == (100, 2, 9)
    assert len(set(results)) == 3


def test_a_result_of_one_message_is_its_first() -> None:
    batch = BatchAppendResult(KafkaMessageID(5), 1, 10, 1)
    assert batch.results() == [AppendResult(KafkaMessageID(5), 10, 1)]
    assert batch.results()[0].id.index == 0
