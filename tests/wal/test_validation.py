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

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace import errors
from headrace.message import batch, codec
from headrace.message.types import Message, MessageType
from headrace.table.messages import COLLECTION
from headrace.tso import LocalTSO
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.interceptors.txn import TXN_RELEVANT
from headrace.wal.memory.backend import MemoryBackend, MemoryStore
from headrace.wal.validation import SYSTEM, Validator, validate, validate_batch

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


# -- record batches ------------------------------------------------------------

batch_types = st.sampled_from([MessageType.INSERT, MessageType.DELETE]) | st.sampled_from(
    list(MessageType)
)
batch_properties = st.dictionaries(
    st.sampled_from(["k", COLLECTION, "producer_id"]), st.text(max_size=10), max_size=2
)
batch_vchannels = st.sampled_from(["v", "orders-0"]) | st.sampled_from(["", "-bad", "x" * 256])


@st.composite
def producer_batches(draw: st.DrawFn, max_messages: int = 6) -> bytes:
    """Batches as producers may send them, well formed or not: any types, sizes
    and properties, sometimes stamped, flagged system, damaged or cut."""
    vchannel = draw(batch_vchannels)
    txn_id = draw(st.sampled_from([0, 0, 7]))
    msgs = [
        Message(kind, vchannel, payload, props, txn_id=txn_id)
        for kind, payload, props in draw(
            st.lists(
                st.tuples(
                    batch_types,
                    st.binary(max_size=40) | st.binary(max_size=400),
                    st.just({}) | batch_properties,
                ),
                min_size=1,
                max_size=max_messages,
            )
        )
    ]
    info = batch.BatchInfo(
        vchannel,
        draw(st.integers(0, 3)),
        draw(st.integers(0, 3)),
        txn_id,
        draw(st.sampled_from([False, False, False, True])),
    )
    data = bytearray(batch.encode(msgs, info, batch.Limits(1 << 20, 1 << 20)))
    fault = draw(st.sampled_from(["none"] * 6 + ["stamp", "byte", "cut", "props", "empty"]))
    if fault == "stamp":
        batch.stamp(data, draw(st.integers(0, 2)), draw(st.integers(1, 2)))
    elif fault == "byte":
        data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
    elif fault == "cut":
        del data[draw(st.integers(0, len(data) - 1)) :]
    elif fault == "props":
        data = bytearray(_with_bad_properties(bytes(data)))
    elif fault == "empty":
        data = bytearray(_with_empty_properties(bytes(data)))
    return bytes(data)


def _with_empty_properties(data: bytes) -> bytes:
    """``data`` with an empty properties block (count 0) in its first record, as
    a producer may encode no properties (format 1 encodes none: 0 bytes)."""
    header = batch.verify(data)
    first = batch.shapes(data, header)[0]
    if first.properties_length:
        return data
    at = header.records_at
    length = int.from_bytes(data[at : at + 4], "little")
    out = bytearray(data[:at])
    out += (length + 2).to_bytes(4, "little") + data[at + 4 : at + 8] + (2).to_bytes(4, "little")
    out += b"\x00\x00" + data[at + 12 :]
    out[4:8] = len(out).to_bytes(4, "little")
    out[28:32] = crc32c.crc32c(bytes(out[32:])).to_bytes(4, "little")
    return bytes(out)


def _with_bad_properties(data: bytes) -> bytes:
    """``data`` with the first properties block's count raised, CRC fixed: the
    framing holds, the properties do not decode."""
    for shape in batch.shapes(data, batch.verify(data)):
        if shape.properties_length:
            out = bytearray(data)
            out[shape.properties_at] ^= 0x01
            out[28:32] = crc32c.crc32c(bytes(out[32:])).to_bytes(4, "little")
            return bytes(out)
    return data


def same_verdict(got: object, want: object) -> bool:
    if isinstance(want, errors.HeadraceError):
        return type(got) is type(want) and str(got) == str(want)
    return got == want


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(producer_batches(), min_size=1, max_size=6), max_sizes, st.booleans())
def test_the_batch_fast_path_agrees_with_validate_batch_on_every_input(
    found: list[bytes], max_bytes: int, collections: bool
) -> None:
    limits = batch.Limits(max_bytes, 2 * max_bytes)
    validator = Validator(max_bytes, limits, collections=collections)
    for _ in range(2):  # the second pass meets the vchannels the first made good
        for data in found:
            got = validator.check_batch(data)
            want = validate_batch(data, limits, collections=collections)
            assert same_verdict(got, want), (data, got, want)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(producer_batches(max_messages=1) | producer_batches(), min_size=1, max_size=12),
    max_sizes,
    st.sampled_from([1, 2, 1000]),
    st.booleans(),
)
def test_the_request_pass_agrees_with_validate_batch_on_every_input(
    found: list[bytes], max_bytes: int, batch_factor: int, collections: bool
) -> None:
    """check_batches (a request's batches in one pass) says what validate_batch
    says of each batch, in order, also once the vchannels are known good."""
    limits = batch.Limits(max_bytes, batch_factor * max_bytes)
    validator = Validator(max_bytes, limits, collections=collections)
    for _ in range(2):
        got = validator.check_batches(found)
        want = [validate_batch(data, limits, collections=collections) for data in found]
        assert len(got) == len(want)
        for data, one, expected in zip(found, got, want, strict=True):
            assert same_verdict(one, expected), (data, one, expected)


@pytest.mark.parametrize(
    ("payload", "limits"),
    [
        (40, batch.Limits(100, 100)),  # the batch is over its bound, the message is not
        (90, batch.Limits(100, 1000)),  # the message is over its bound, the batch is not
    ],
)
def test_the_request_pass_refuses_a_one_message_batch_over_a_bound_on_a_known_vchannel(
    payload: int, limits: batch.Limits
) -> None:
    validator = Validator(limits.max_message_bytes, limits)
    small = batch.encode([Message(MessageType.INSERT, "v", b"x")], batch.BatchInfo("v", 1, 1))
    big = batch.encode(
        [Message(MessageType.INSERT, "v", bytes(payload))],
        batch.BatchInfo("v", 1, 2),
        batch.Limits(1 << 20, 1 << 20),
    )
    got = validator.check_batches([small, big, small])
    want = [validate_batch(data, limits, collections=False) for data in (small, big, small)]
    assert isinstance(want[1], errors.MessageTooLarge)
    assert all(same_verdict(g, w) for g, w in zip(got, want, strict=True)), (got, want)


def test_the_batch_routes() -> None:
    """Whole unless a message needs the per-message path; then alone or refused."""
    limits = batch.Limits(1024, 4096)

    def route(msgs: list[Message], collections: bool = False) -> object:
        data = batch.encode(msgs, batch.BatchInfo("v", txn_id=msgs[0].txn_id))
        verdict = Validator(1024, limits, collections=collections).check_batch(data)
        return verdict if isinstance(verdict, errors.HeadraceError) else verdict.whole

    insert = Message(MessageType.INSERT, "v", b"x")
    named = Message(MessageType.INSERT, "v", b"x", {COLLECTION: "c"})
    assert route([insert, insert]) is True
    assert route([named, insert]) is True, "no collection hooks: opaque"
    assert route([named], collections=True) is False
    assert isinstance(route([insert, named], collections=True), errors.InvalidArgument)
    assert route([Message(MessageType.BEGIN_TXN, "v")]) is False
    keyed = Message(MessageType.INSERT, "v", b"x", {"producer_id": "p", "producer_seq": "1"})
    assert route([keyed]) is False, "format 1's dedup key: deduplicated per message"
    assert route([Message(MessageType.CREATE_COLLECTION, "v")]) is False
