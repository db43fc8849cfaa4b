"""Offline listing of a local WAL's records (``headrace wal dump``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import NamedTuple

from headrace import errors
from headrace.message import batch, codec
from headrace.wal.local import files, scan
from headrace.wal.local.backend import PCHANNEL_PATTERN
from headrace.wal.local.chain import Link
from headrace.wal.local.channel import Channel
from headrace.wal.local.segment import HEADER_SIZE, Stop


class DumpRow(NamedTuple):
    id: str
    type: str
    vchannel: str
    timetick: int
    term: int
    size: int
    error: str = ""
    """Why the record could not be decoded as a message; empty if it could."""


def iter_dump(root: str, pchannel: str) -> Iterator[DumpRow]:
    """One row per readable record of ``pchannel`` under ``root``, in order.

    Records that are not valid messages are reported with ``error`` set; a
    frame that fails its storage checks raises CorruptData naming the file
    and byte offset.
    """
    if not PCHANNEL_PATTERN.match(pchannel):
        raise errors.InvalidArgument(f"invalid pchannel name {errors.quoted(pchannel)}")
    channel = Channel(os.fspath(root), pchannel)
    if not os.path.isdir(channel.directory):
        raise errors.NotFound(f"no local WAL for pchannel {pchannel} under {root}")
    try:
        chain = channel.load_chain()
        for link in chain.links:
            yield from _dump_segment(link, chain.marker)
        if chain.broken is not None:
            raise chain.broken
    except OSError as exc:
        raise files.storage_error(exc, f"reading {channel.directory}") from None
    finally:
        channel.close()


def _dump_segment(link: Link, marker: int) -> Iterator[DumpRow]:
    fd = scan.open_segment(link)
    if fd is None:
        return
    try:
        pos, lsn = HEADER_SIZE, link.base_lsn
        while True:
            parsed = scan.read_chunk(
                fd, pos, lsn, link.limit, scan.ALL, checksum=link.header.checksum
            )
            for record in parsed.records():
                if record.id.sort_key()[0] >= marker:
                    yield _row(str(record.id), record.data, link.name.term)
            if parsed.n_records:
                pos, lsn = parsed.pos, parsed.lsn
                continue
            if link.limit is not None and pos != link.limit:
                raise scan.strict_failure(link, parsed)
            if link.limit is None and parsed.stop is Stop.BAD:
                scan.check_bad_tail(fd, link, pos, lsn)
            return
    finally:
        os.close(fd)


def _row(mid: str, data: bytes, segment_term: int) -> DumpRow:
    try:
        if batch.is_batch(data):
            return _batch_row(mid, data)
        header = codec.peek(data)
    except errors.CorruptData as exc:
        return DumpRow(mid, "?", "", 0, segment_term, len(data), exc.message)
    return DumpRow(mid, header.type.name, header.vchannel, header.timetick, header.term, len(data))


def _batch_row(mid: str, data: bytes) -> DumpRow:
    """A record batch: one message shows as that message; more as ``BATCH[n]``
    (its first timetick)."""
    head = batch.read_header(data)
    kind = f"BATCH[{head.count}]"
    if head.count == 1:
        kind = batch.record_types(data, head)[0].name
    return DumpRow(mid, kind, head.vchannel, head.base_timetick, head.term, len(data))
