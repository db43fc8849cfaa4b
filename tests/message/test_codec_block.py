"""Bulk decoding (``codec.decode_block``): the same result and the same checks as
``codec.decode`` record by record, and header filters that agree with the
readers' own rule."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace import errors
from headrace.message import codec
from headrace.message.types import LogEntry, Message, MessageType
from headrace.wal.api import ReadOptions
from headrace.wal.delivery import Delivery
from headrace.wal.memory import MemoryMessageID as MID

from .test_codec import messages, vchannels


def block(encoded: list[bytes], gap: bytes = b"") -> tuple[bytes, list[int]]:
    """One buffer holding ``encoded`` (each after ``gap``), and their bounds."""
    parts: list[bytes] = []
    bounds: list[int] = []
    pos = 0
    for data in encoded:
        parts += [gap, data]
        pos += len(gap)
        bounds += [pos, pos + len(data)]
        pos += len(data)
    return b"".join(parts), bounds


@given(st.lists(messages, max_size=8), st.binary(max_size=6), st.booleans())
def test_a_block_decodes_as_each_record_alone(
    msgs: list[Message], gap: bytes, verify: bool
) -> None:
    encoded = [codec.encode(m) for m in msgs]
    data, bounds = block(encoded, gap)
    ids = [MID(i) for i in range(len(msgs))]
    entries = codec.decode_block(data, bounds, ids, verify=verify)
    assert entries == [LogEntry(mid, codec.decode(e)) for mid, e in zip(ids, encoded, strict=True)]
    assert [type(e) for e in entries] == [LogEntry] * len(msgs)
    assert [e.message for e in entries] == msgs


def test_plain_messages_share_their_vchannel_and_empty_properties() -> None:
    msgs = [Message(MessageType.INSERT, "v-1", b"a%d" % i, {}, i + 1, 2) for i in range(3)]
    msgs.append(Message(MessageType.DELETE, "v-2", b"b", {}, 9, 2))
    msgs.append(Message(MessageType.TIME_TICK, "", b"", {}, 10, 2))
    data, bounds = block([codec.encode(m) for m in msgs])
    entries = codec.decode_block(data, bounds, [MID(i) for i in range(5)])
    assert [e.message for e in entries] == msgs
    assert entries[0].message.vchannel is entries[2].message.vchannel
    assert entries[0].message.properties == {}
    with pytest.raises(TypeError):
        entries[0].message.properties["k"] = "v"  # type: ignore[index]


@pytest.mark.parametrize("verify", [True, False])
def test_the_first_bad_record_raises_as_decode_does(verify: bool) -> None:
    good = codec.encode(Message(MessageType.INSERT, "v", b"payload", {}, 1, 1))
    short = good[:20]
    bad_magic = b"XX" + good[2:]
    bad_version = good[:2] + b"\x07" + good[3:]
    bad_type = good[:3] + b"\xee" + good[4:]
    bad_length = good[:-4] + b"!" + good[-4:]
    for bad in (short, bad_magic, bad_version, bad_type, bad_length):
        data, bounds = block([good, bad, good])
        with pytest.raises(errors.CorruptData) as alone:
            codec.decode(bad, verify=verify)
        with pytest.raises(errors.CorruptData) as bulk:
            codec.decode_block(data, bounds, [MID(0), MID(1), MID(2)], verify=verify)
        assert str(bulk.value) == str(alone.value)


def test_a_crc_mismatch_is_found_only_when_verifying() -> None:
    good = codec.encode(Message(MessageType.INSERT, "v", b"payload", {}, 1, 1))
    flipped = bytearray(good)
    flipped[-6] ^= 0x01  # inside the payload
    data, bounds = block([good, bytes(flipped)])
    with pytest.raises(errors.CorruptData, match="CRC"):
        codec.decode_block(data, bounds, [MID(0), MID(1)])
    entries = codec.decode_block(data, bounds, [MID(0), MID(1)], verify=False)
    assert entries[1].message.payload != b"payload"


def test_bad_vchannel_text_is_corrupt() -> None:
    good = codec.encode(Message(MessageType.INSERT, "vv", b"x", {}, 1, 1))
    bad = bytearray(good[:-4])
    bad[32:34] = b"\xff\xfe"
    data, bounds = block([bytes(bad) + struct.pack("<I", zlib.crc32(bytes(bad)))])
    with pytest.raises(errors.CorruptData, match="UTF-8"):
        codec.decode_block(data, bounds, [MID(0)])


def test_ids_and_bounds_must_match() -> None:
    data, bounds = block([codec.encode(Message(MessageType.INSERT, "v", b"x", {}, 1, 1))])
    with pytest.raises(errors.InvalidArgument):
        codec.decode_block(data, [*bounds, 0, 1], [MID(0)])


options = st.builds(
    ReadOptions,
    vchannels=st.lists(st.sampled_from(["a", "b", "c"]), max_size=2),
    types=st.lists(st.sampled_from(list(MessageType)), max_size=3),
    timetick_gt=st.one_of(st.none(), st.integers(0, 20)),
    timetick_ge=st.one_of(st.none(), st.integers(0, 20)),
)
filtered = st.builds(
    Message,
    type=st.sampled_from(list(MessageType)),
    vchannel=st.one_of(st.sampled_from(["", "a", "b", "c"]), vchannels),
    payload=st.binary(max_size=16),
    properties=st.one_of(st.just({}), st.dictionaries(st.text(max_size=3), st.text(max_size=3))),
    timetick=st.integers(0, 25),
    term=st.integers(0, 3),
    txn_id=st.one_of(st.just(0), st.integers(1, 5)),
)


@given(st.lists(filtered, max_size=10), options)
def test_the_header_filter_leaves_out_what_the_reader_would_not_deliver(
    msgs: list[Message], opts: ReadOptions
) -> None:
    keep = Delivery(opts).header_filter
    data, bounds = block([codec.encode(m) for m in msgs])
    ids = [MID(i) for i in range(len(msgs))]
    out = codec.decode_block(data, bounds, ids, keep=keep)
    for mid, msg, got in zip(ids, msgs, out, strict=True):
        assert got.id == mid
        if keep is None or msg.txn_id or opts.accepts(msg):
            assert got == LogEntry(mid, msg)
        else:
            assert got == codec.Skipped(mid, msg.type, msg.vchannel, msg.timetick, msg.term)
