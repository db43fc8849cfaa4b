"""The message envelope codec: round trips, peek, and every corruption case."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace import errors
from headrace.message import codec
from headrace.message.types import Message, MessageType
from headrace.wal.memory import MemoryMessageID as MID

vchannels = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,40}", fullmatch=True)
text = st.text(max_size=20)
messages = st.builds(
    Message,
    type=st.sampled_from(list(MessageType)),
    vchannel=st.one_of(st.just(""), vchannels),
    payload=st.binary(max_size=512),
    properties=st.dictionaries(text, text, max_size=5),
    timetick=st.integers(0, 2**64 - 1),
    term=st.integers(0, 2**64 - 1),
    txn_id=st.integers(0, 2**64 - 1),
)


def sample() -> Message:
    return Message(MessageType.INSERT, "vch-1", b"payload", {"k": "v", "key2": "value2"}, 77, 3, 5)


def recrc(body: bytes) -> bytes:
    """Fix the CRC of a tampered envelope so the check under test is reached."""
    return body[:-4] + struct.pack("<I", zlib.crc32(body[:-4]))


@given(messages)
def test_round_trip(msg: Message) -> None:
    data = codec.encode(msg)
    assert len(data) == codec.encoded_size(msg)
    decoded = codec.decode(data)
    assert decoded == msg
    assert codec.decode(memoryview(data), verify=False) == msg


@given(messages)
def test_peek_reads_the_header_only(msg: Message) -> None:
    data = codec.encode(msg)
    header = codec.peek(data)
    assert header == codec.Header(msg.type, msg.vchannel, msg.timetick, msg.term)


def test_peek_does_not_check_the_crc_but_decode_does() -> None:
    data = bytearray(codec.encode(sample()))
    data[-5] ^= 0xFF  # inside the payload
    assert codec.peek(bytes(data)).timetick == 77
    with pytest.raises(errors.CorruptData, match="CRC"):
        codec.decode(bytes(data))


def test_bad_magic() -> None:
    data = recrc(b"XX" + codec.encode(sample())[2:])
    for fn in (codec.peek, codec.decode):
        with pytest.raises(errors.CorruptData, match="magic"):
            fn(data)


def test_unknown_format_version() -> None:
    raw = bytearray(codec.encode(sample()))
    raw[2] = 99
    with pytest.raises(errors.CorruptData, match="version 99"):
        codec.decode(recrc(bytes(raw)))


def test_unknown_type_code() -> None:
    raw = bytearray(codec.encode(sample()))
    raw[3] = 200
    with pytest.raises(errors.CorruptData, match="type code 200"):
        codec.decode(recrc(bytes(raw)))


@pytest.mark.parametrize("cut", [1, 4, 10])
def test_length_mismatch_truncated(cut: int) -> None:
    data = codec.encode(sample())
    with pytest.raises(errors.CorruptData, match=r"length|shorter"):
        codec.decode(data[:-cut])


def test_length_mismatch_extra_bytes_and_short_input() -> None:
    data = codec.encode(sample())
    with pytest.raises(errors.CorruptData, match="length"):
        codec.decode(data + b"\0")
    with pytest.raises(errors.CorruptData, match="shorter"):
        codec.decode(data[:20])
    with pytest.raises(errors.CorruptData):
        codec.decode(b"")


def test_crc_mismatch() -> None:
    raw = bytearray(codec.encode(sample()))
    raw[-1] ^= 0x01
    with pytest.raises(errors.CorruptData, match="CRC"):
        codec.decode(bytes(raw))
    assert codec.decode(bytes(raw), verify=False) == sample()


def _properties_offset(msg: Message) -> int:
    return codec.HEADER_SIZE + len(msg.vchannel.encode()) + (8 if msg.txn_id else 0)


@pytest.mark.parametrize(
    "block",
    [
        struct.pack("<H", 3) + b"\0" * 8,  # claims 3 entries, holds less
        struct.pack("<HH", 1, 200) + b"k" * 6,  # key longer than the block
        struct.pack("<HH", 1, 1) + b"k" + struct.pack("<I", 1) + b"\xff",  # value not UTF-8
        struct.pack("<HH", 1, 1) + b"k" + struct.pack("<I", 0) + b"zz",  # trailing bytes
    ],
)
def test_malformed_properties(block: bytes) -> None:
    msg = Message(MessageType.DELETE, "v", b"pp", {"a": "b"})
    data = codec.encode(msg)
    start = _properties_offset(msg)
    old_len = struct.unpack_from("<I", data, 28)[0]
    head = bytearray(data[:start])
    struct.pack_into("<I", head, 28, len(block))
    body = bytes(head) + block + data[start + old_len : -4]
    with pytest.raises(errors.CorruptData, match="properties"):
        codec.decode(recrc(body + b"\0\0\0\0"))


def test_oversize_is_refused_before_encoding() -> None:
    msg = Message(MessageType.INSERT, "v", b"x" * 1000)
    size = codec.encoded_size(msg)
    assert len(codec.encode(msg, max_size=size)) == size
    with pytest.raises(errors.MessageTooLarge, match="nothing was written"):
        codec.encode(msg, max_size=size - 1)
    assert errors.MessageTooLarge("x").code is errors.ErrorCode.TOO_LARGE


def test_unencodable_properties_are_invalid_arguments() -> None:
    with pytest.raises(errors.InvalidArgument):
        codec.encode(Message(MessageType.INSERT, "v", properties={"k" * 70_000: "v"}))


def test_txn_flag_controls_the_txn_field() -> None:
    with_txn = codec.encode(Message(MessageType.INSERT, "v", b"p", txn_id=1))
    without = codec.encode(Message(MessageType.INSERT, "v", b"p"))
    assert len(with_txn) == len(without) + 8
    raw = bytearray(with_txn)
    raw[4] = 0  # clear the txn flag: the length no longer matches
    with pytest.raises(errors.CorruptData, match="length"):
        codec.decode(recrc(bytes(raw)))


def test_vchannel_that_is_not_utf8() -> None:
    raw = bytearray(codec.encode(Message(MessageType.INSERT, "ab", b"p")))
    raw[codec.HEADER_SIZE] = 0xFF
    data = recrc(bytes(raw))
    for fn in (codec.peek, codec.decode):
        with pytest.raises(errors.CorruptData, match="vchannel"):
            fn(data)


@pytest.mark.parametrize(
    "msg",
    [
        Message(MessageType.INSERT, "v", properties={"k": "\ud800"}),
        Message(MessageType.INSERT, "v\udfff"),
        Message(MessageType.INSERT, "v", txn_id=-1),
        Message(MessageType.INSERT, "v", timetick=2**64),
    ],
)
def test_unencodable_values_are_invalid_arguments(msg: Message) -> None:
    with pytest.raises(errors.InvalidArgument):
        codec.encode(msg)


@pytest.mark.parametrize("version", [0, 3, 255])
def test_unknown_format_names_both_versions(version: int) -> None:
    """A log entry of a format this release does not read: the error names the
    entry's version and the formats this release reads, in decode, peek and
    decode_block alike."""
    good = codec.encode(sample())
    bad = recrc(good[:2] + bytes([version]) + good[3:])
    expected = rf"format version {version} \(this release reads \{{1, 2\}}\)"
    with pytest.raises(errors.CorruptData, match=expected):
        codec.decode(bad)
    with pytest.raises(errors.CorruptData, match=expected):
        codec.peek(bad)
    ids = [MID(1)]
    with pytest.raises(errors.CorruptData, match=expected):
        codec.decode_block(bad, [0, len(bad)], ids)


def test_a_format_1_envelope_saying_format_2_is_named_as_such() -> None:
    """Format 2 is stored as record batches, never in this envelope."""
    good = codec.encode(sample())
    bad = recrc(good[:2] + bytes([2]) + good[3:])
    with pytest.raises(errors.CorruptData, match=r"envelope of format version 2.*are batches"):
        codec.decode(bad)
