"""Message-format versions: the release's declared sets and the pure rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace import errors
from headrace.message import codec, formats
from headrace.message.formats import FormatSupport
from headrace.message.types import Message, MessageType

versions = st.frozensets(st.integers(1, 5), min_size=1, max_size=4)


@st.composite
def supports(draw: st.DrawFn) -> FormatSupport:
    reads = draw(versions)
    writes = draw(st.frozensets(st.sampled_from(sorted(reads)), min_size=1))
    return FormatSupport(reads, writes)


def test_release_declares_format_1_and_the_codec_follows_it() -> None:
    assert FormatSupport.of({1, 2}, {1, 2}) == formats.RELEASE_FORMATS
    assert FormatSupport.of({1}, {1}) == formats.LEGACY_FORMATS
    data = codec.encode(Message(MessageType.INSERT, "v", b"x"), format_version=1)
    assert data[2] == 1
    with pytest.raises(errors.InvalidArgument, match=r"format 2 is written as record batches"):
        codec.encode(Message(MessageType.INSERT, "v", b"x"), format_version=2)
    with pytest.raises(
        errors.InvalidArgument, match=r"format version 3 \(this release writes \{1, 2\}\)"
    ):
        codec.encode(Message(MessageType.INSERT, "v", b"x"), format_version=3)


@pytest.mark.parametrize(
    ("reads", "writes"), [({1}, set()), ({1}, {2}), ({0, 1}, {1}), (set(), {1})]
)
def test_support_must_be_consistent(reads: set[int], writes: set[int]) -> None:
    with pytest.raises(errors.InvalidArgument):
        FormatSupport.of(reads, writes)


def test_designed_for_a_second_format() -> None:
    """A release reading and writing {1, 2} in a cluster still on 1 writes 1."""
    both = FormatSupport.of({1, 2}, {1, 2})
    old = FormatSupport.of({1}, {1})
    assert formats.placement_refusal(both, {1}, 1) == ""
    assert formats.placement_refusal(old, {1}, 1) == ""
    # After the switch an old node can take nothing: it cannot write 2 ...
    assert "cannot write" in formats.placement_refusal(old, {1}, 2)
    # ... and once a log holds 2, it cannot read it either.
    assert "holds message format {2}" in formats.placement_refusal(old, {1, 2}, 2)
    assert formats.switch_refusal({"a": both, "b": old}, 1, 2).startswith(
        "not every registered node can read and write format 2: b (reads {1}, writes {1})"
    )
    assert formats.switch_refusal({"a": both, "b": both}, 1, 2) == ""
    assert formats.common_writable({"a": both, "b": both}) == 2
    assert formats.common_writable({"a": both, "b": old}) == 1


@given(supports(), versions, st.integers(1, 5))
def test_placement_refusal_is_exactly_read_and_write(
    support: FormatSupport, written: frozenset[int], cluster: int
) -> None:
    refused = formats.placement_refusal(support, written, cluster)
    able = written <= support.reads and cluster in support.writes
    assert (refused == "") == able


@given(
    st.dictionaries(st.sampled_from("abcd"), supports(), max_size=4),
    st.integers(1, 5),
    st.integers(0, 6),
)
def test_switch_refusal(nodes: dict[str, FormatSupport], current: int, target: int) -> None:
    refused = formats.switch_refusal(nodes, current, target)
    allowed = (
        target >= max(current, 1)
        and bool(nodes)
        and all(target in s.reads and target in s.writes for s in nodes.values())
    )
    assert (refused == "") == allowed
    if nodes and formats.common_writable(nodes) >= current:
        assert formats.switch_refusal(nodes, current, formats.common_writable(nodes)) == ""
