"""Message ids of the memory and local backends: bytes, strings, order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace import errors
from headrace.message import ids
from headrace.wal.local import LocalMessageID
from headrace.wal.memory import MemoryMessageID

ID_CLASSES = [LocalMessageID, MemoryMessageID]
U64 = st.integers(min_value=0, max_value=2**64 - 1)


@pytest.mark.parametrize("cls", ID_CLASSES)
@given(value=U64)
def test_round_trips(cls: type[LocalMessageID] | type[MemoryMessageID], value: int) -> None:
    mid = cls(value)
    assert cls.from_bytes(mid.to_bytes()) == mid
    assert ids.parse(str(mid)) == mid
    assert str(mid) == f"{cls.backend}:{value}"
    assert ids.from_wire(ids.to_wire(mid)) == mid
    assert hash(ids.parse(str(mid))) == hash(mid)


@pytest.mark.parametrize("cls", ID_CLASSES)
@given(a=U64, b=U64)
def test_order_follows_the_value_and_the_bytes(
    cls: type[LocalMessageID] | type[MemoryMessageID], a: int, b: int
) -> None:
    left, right = cls(a), cls(b)
    assert (left < right) == (a < b)
    assert (left == right) == (a == b)
    assert (left.to_bytes() < right.to_bytes()) == (a < b)


@pytest.mark.parametrize("cls", ID_CLASSES)
@given(data=st.binary().filter(lambda b: len(b) != 8))
def test_bad_bytes_are_rejected(
    cls: type[LocalMessageID] | type[MemoryMessageID], data: bytes
) -> None:
    with pytest.raises(errors.InvalidArgument):
        cls.from_bytes(data)


@pytest.mark.parametrize("cls", ID_CLASSES)
@pytest.mark.parametrize("text", ["", "-1", "1.5", "x", " 7", "١٢", str(2**64)])
def test_bad_strings_are_rejected(
    cls: type[LocalMessageID] | type[MemoryMessageID], text: str
) -> None:
    with pytest.raises(errors.InvalidArgument):
        cls.parse_value(text)


def test_ids_of_different_backends_do_not_compare() -> None:
    assert LocalMessageID(1) != MemoryMessageID(1)
    with pytest.raises(errors.InvalidArgument):
        _ = LocalMessageID(1) < MemoryMessageID(2)
    with pytest.raises(errors.InvalidArgument):
        LocalMessageID(-1)
