"""Message-format versions: which ones a release reads and writes, and the rules.

A log entry carries the format version it was encoded in (byte 2 of the
envelope, :mod:`headrace.message.codec`). One release reads a set of formats
and can write a set of formats (every format it writes it also reads):
:data:`RELEASE_FORMATS` is this release's. Which of its writable formats a
node actually writes is not its own choice: it is the **cluster's format
version**, one record in the metastore (default :data:`DEFAULT_FORMAT`),
switched forward only when every registered node can read and write the new
one (``headrace format set N``, or the last step of an UpgradePlan). The rules,
as pure predicates used by the node, the coordinator and the operator:

* a node opens a WAL for writing only in the cluster's format, and only if it
  can write it (:func:`write_refusal`);
* a pchannel goes only to a node that reads every format written in its log
  and can write the cluster's (:func:`placement_refusal`);
* the cluster's format moves forward only, and only to a format every
  registered node reads and writes (:func:`switch_refusal`).

A node registered before nodes advertised formats read and wrote format 1
only (:data:`LEGACY_FORMATS`); so did every log written before the
pchannel's formats were recorded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from headrace import errors

DEFAULT_FORMAT = 1
"""The cluster's format version when none was ever set, and the format of every
log entry written before formats were recorded."""


def describe(formats: Iterable[int]) -> str:
    """``{1, 2}``: a set of format versions for messages (pure)."""
    return "{" + ", ".join(str(v) for v in sorted(set(formats))) + "}"


@dataclasses.dataclass(frozen=True, slots=True)
class FormatSupport:
    """The message formats one release reads and the ones it can write."""

    reads: frozenset[int]
    writes: frozenset[int]

    def __post_init__(self) -> None:
        if not self.writes or any(v < 1 for v in self.reads | self.writes):
            raise errors.InvalidArgument(
                f"format versions are positive and a release writes at least one: "
                f"reads {describe(self.reads)}, writes {describe(self.writes)}"
            )
        if not self.writes <= self.reads:
            raise errors.InvalidArgument(
                f"a release reads every format it writes: reads {describe(self.reads)}, "
                f"writes {describe(self.writes)}"
            )

    @classmethod
    def of(cls, reads: Iterable[int], writes: Iterable[int]) -> FormatSupport:
        return cls(frozenset(reads), frozenset(writes))

    def __str__(self) -> str:
        return f"reads {describe(self.reads)}, writes {describe(self.writes)}"


RELEASE_FORMATS = FormatSupport.of(reads={1, 2}, writes={1, 2})
"""What this release's codec reads and can write: format 1 messages
(:mod:`.codec`) and format 2 record batches (:mod:`.batch`)."""

LEGACY_FORMATS = FormatSupport.of(reads={DEFAULT_FORMAT}, writes={DEFAULT_FORMAT})
"""What a node record without advertised formats means."""


def write_refusal(support: FormatSupport, cluster_format: int) -> str:
    """Why a node with ``support`` must not write a log in ``cluster_format``;
    empty when it may."""
    if cluster_format in support.writes:
        return ""
    return (
        f"the cluster writes message format {cluster_format}, which this release cannot "
        f"write ({support})"
    )


def read_refusal(support: FormatSupport, written: Iterable[int]) -> str:
    """Why a node with ``support`` cannot read a log holding ``written``; empty if it can."""
    unreadable = set(written) - support.reads
    if not unreadable:
        return ""
    return (
        f"its log holds message format {describe(unreadable)}, which a node that "
        f"{support} cannot read"
    )


def placement_refusal(support: FormatSupport, written: Iterable[int], cluster_format: int) -> str:
    """Why a node with ``support`` must not take a pchannel whose log holds
    ``written`` in a cluster writing ``cluster_format``; empty when it may."""
    return read_refusal(support, written) or write_refusal(support, cluster_format)


def switch_refusal(nodes: Mapping[str, FormatSupport], current: int, target: int) -> str:
    """Why the cluster's format must not go from ``current`` to ``target`` with
    ``nodes`` registered; empty when it may (also when ``target == current``)."""
    if target < 1:
        return f"format versions start at 1, not {target}"
    if target < current:
        return (
            f"the cluster already writes message format {current}; formats only move "
            f"forward (logs hold format {current} entries that older formats' readers may not read)"
        )
    if not nodes:
        return "no node is registered to check that it can read and write the format"
    unable = sorted(
        f"{node} ({support})"
        for node, support in nodes.items()
        if target not in support.reads or target not in support.writes
    )
    if unable:
        return f"not every registered node can read and write format {target}: " + ", ".join(unable)
    return ""


def common_writable(nodes: Mapping[str, FormatSupport]) -> int:
    """The highest format every node in ``nodes`` reads and writes; 0 when none
    (or no nodes)."""
    if not nodes:
        return 0
    shared = frozenset.intersection(*(s.reads & s.writes for s in nodes.values()))
    return max(shared, default=0)
