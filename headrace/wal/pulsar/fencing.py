"""How a Pulsar message carries its term stamp (:mod:`headrace.wal.brokers.stamps`; pure).

Each message has one property ``headrace``:

* data: ``d:<term>:<writer nonce>``
* fence record: ``f:<term>:<writer nonce>:<id of the last data message or ->``

A writer that takes the topic (an ``ExclusiveWithFencing`` producer fences the
previous one) writes one fence record with its term; the decisions on stamps
are the toolkit's (:func:`headrace.wal.brokers.stamps.fence_check`,
:func:`headrace.wal.brokers.stamps.overtaken`).
"""

from __future__ import annotations

from headrace import errors
from headrace.wal.brokers.stamps import FOREIGN, Kind, Stamp
from headrace.wal.pulsar.message_id import PulsarMessageID

PROPERTY = "headrace"
_LETTERS = {Kind.DATA: "d", Kind.FENCE: "f"}
PulsarStamp = Stamp[PulsarMessageID]


def properties(stamp: PulsarStamp) -> dict[str, str]:
    """The message properties that carry ``stamp``."""
    text = f"{_LETTERS[stamp.kind]}:{stamp.term}:{stamp.nonce}"
    if stamp.kind is Kind.FENCE:
        text += ":" + (stamp.prev.value_str() if stamp.prev is not None else "-")
    return {PROPERTY: text}


def stamp_of(props: dict[str, str]) -> PulsarStamp:
    """The stamp among a message's properties; none reads as :data:`FOREIGN`."""
    text = props.get(PROPERTY)
    if text is None:
        return FOREIGN
    kind, _, rest = text.partition(":")
    term, _, rest = rest.partition(":")
    nonce, _, prev = rest.partition(":")
    try:
        if kind == _LETTERS[Kind.DATA] and not prev:
            return Stamp(Kind.DATA, int(term), int(nonce))
        if kind == _LETTERS[Kind.FENCE] and prev:
            pointer = None if prev == "-" else PulsarMessageID.parse_value(prev)
            return Stamp(Kind.FENCE, int(term), int(nonce), pointer)
    except (ValueError, errors.InvalidArgument):
        pass
    raise errors.CorruptData(f"malformed headrace message property {text[:80]!r}")
