"""Validation and its fast path agree on every input (property-based).

:meth:`Validator.check` answers from a fast path for common messages and
asks :func:`validate` for the rest. For any sequence of messages, well formed
or not, it must accept exactly what :func:`validate` accepts, with the same
size, and refuse the rest with the same error; and :func:`validate` refuses
bad input with a Headrace error, never a TypeError or AttributeError.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace import errors
from headrace.message import codec
from headrace.message.types import Message, MessageType
from headrace.tso import LocalTSO
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.interceptors.txn import TXN_RELEVANT
from headrace.wal.memory.backend import MemoryBackend, MemoryStore
from headrace.wal.validation import SYSTEM, Validator, validate

GOOD_NAMES = ["v", "orders-0", "a.b_c", "x" * 255]


class BytesSub(bytes):
    pass


def _any_text(max_size: int) -> st.SearchStrategy[str]:
    return st.text(max_size=max_size) | st.sampled_from(["", "é", "\ud800", "k" * 40])


keys = _any_text(12) | st.integers(-2, 2)
values = _any_text(12) | st.integers(-2, 2) | st.none()
property_maps: st.SearchStrategy[Any] = (
    st.just(MappingProxyType({}))
    | st.dictionaries(keys, values, max_size=4)
    | st.dictionaries(_any_text(8), _any_text(30), max_size=3)
    | st.dictionaries(_any_text(8), _any_text(30), max_size=3).map(MappingProxyType)
    | st.lists(st.tuples(keys, values), max_size=2)
    | st.none()
)
message_types: st.SearchStrategy[Any] = (
    st.sampled_from(list(MessageType)) | st.integers(-1, 40) | st.none()
)
vchannels: st.SearchStrategy[Any] = (
    st.sampled_from(GOOD_NAMES)
    | st.sampled_from(["", "-a", "a/b", "x" * 256, "é"])
    | st.text(max_size=20)
    | st.binary(max_size=4)
    | st.integers()
    | st.lists(st.integers(), max_size=1)
)
payloads: st.SearchStrategy[Any] = (
    st.binary(max_size=300)
    | st.binary(max_size=8).map(BytesSub)
    | st.binary(max_size=8).map(bytearray)
    | st.text(max_size=4)
    | st.none()
)
txn_ids: st.SearchStrategy[Any] = (
    st.just(0)
    | st.integers(-2, 3)
    | st.sampled_from([(1 << 64) - 1, 1 << 64])
    | st.booleans()
    | st.sampled_from([0.0, 1.5, "0"])
)
messages = st.builds(
    Message, message_types, vchannels, payloads, property_maps, st.just(0), st.just(0), txn_ids
)
max_sizes = st.integers(codec.HEADER_SIZE + 4, 700)


def reference(msg: Message, max_bytes: int) -> tuple[int, bool] | errors.HeadraceError:
    """What :func:`validate` says, and the plainness of an accepted message."""
    try:
        size = validate(msg, max_bytes)
    except errors.HeadraceError as exc:
        return exc
    plain = msg.type not in SYSTEM | TXN_RELEVANT and msg.txn_id == 0 and not msg.properties
    return (size, plain)


def same(got: tuple[int, bool] | errors.HeadraceError, want: object) -> bool:
    if isinstance(want, errors.HeadraceError):
        return type(got) is type(want) and str(got) == str(want)
    return got == want


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages, max_size=24), max_sizes)
def test_the_fast_path_agrees_with_validate_on_every_input(
    batch: list[Message], max_bytes: int
) -> None:
    validator = Validator(max_bytes)
    for _ in range(2):  # the second pass meets the vchannels the first made good
        for msg in batch:
            got = validator.check(msg)
            want = reference(msg, max_bytes)
            assert same(got, want), (msg, got, want)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(GOOD_NAMES),
    st.binary(max_size=300),
    st.dictionaries(st.sampled_from(["producer_id", "producer_seq", "k"]), st.text(max_size=20)),
    max_sizes,
)
def test_a_known_good_message_is_answered_by_the_fast_path_as_validate_does(
    vchannel: str, payload: bytes, properties: dict[str, str], max_bytes: int
) -> None:
    """The common case, generated densely: the same vchannel a second time."""
    validator = Validator(max_bytes)
    validator.check(Message(MessageType.INSERT, vchannel, b""))
    msg = Message(MessageType.INSERT, vchannel, payload, properties)
    assert same(validator.check(msg), reference(msg, max_bytes))


def test_wrong_types_are_refused_with_a_clear_error() -> None:
    """Not a TypeError or AttributeError from deep inside: InvalidArgument."""
    bad = [
        Message(MessageType.INSERT, "v", b"x", txn_id="1"),  # type: ignore[arg-type]
        Message(MessageType.INSERT, "v", b"x", txn_id=1.5),  # type: ignore[arg-type]
        Message(MessageType.INSERT, "v", b"x", [("k", "v")]),  # type: ignore[arg-type]
        Message(MessageType.INSERT, "v", b"x", None),  # type: ignore[arg-type]
    ]
    for msg in bad:
        outcome = Validator(1024).check(msg)
        assert isinstance(outcome, errors.InvalidArgument), (msg, outcome)


async def test_the_wal_refuses_a_wrongly_typed_message_alone() -> None:
    wal = await WAL.open(MemoryBackend(MemoryStore()), "p", 1, tso=LocalTSO(), options=WALOptions())
    try:
        good = Message(MessageType.INSERT, "v", b"x")
        odd = Message(MessageType.INSERT, "v", b"x", txn_id="7")  # type: ignore[arg-type]
        first, second = await wal.append_many([good, odd])
        assert not isinstance(first, errors.HeadraceError)
        assert isinstance(second, errors.InvalidArgument) and "txn_id" in second.message
    finally:
        await wal.close()
