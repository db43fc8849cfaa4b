"""Which shard a primary key goes to, and rows cut into messages that fit.

One routing function, :func:`shards_of`, serves inserts and deletes, so a
key's inserts and deletes land on one vchannel, in log order. It must give the
same answer in every process, on every machine, forever (Python's ``hash()``
is salted per process, so it is not used):

* **int64** keys: the 64-bit finaliser of MurmurHash3 (``fmix64``) of the
  key's two's-complement bits, modulo the shard count; computed with pyarrow
  compute kernels (wrapping uint64 arithmetic) over the whole column.
* **string** keys: CRC-32 (``zlib.crc32``) of the key's UTF-8 bytes, modulo
  the shard count (one call per key; CRC-32 runs in C).

Milvus routes the same way (a Murmur3 hash of int64 keys, CRC-32 of strings).
Changing either function would move keys between shards: it is part of the
data format (``tests/client/test_collections.py`` pins known values).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from headrace import errors
from headrace.message.types import Message

_M1 = pa.scalar(0xFF51AFD7ED558CCD, pa.uint64())
_M2 = pa.scalar(0xC4CEB9FE1A85EC53, pa.uint64())
_S33 = pa.scalar(33, pa.uint64())


def _fmix64(bits: pa.Array) -> pa.Array:
    """MurmurHash3's ``fmix64`` of each uint64 (unchecked kernels wrap, as C does)."""
    k = bits
    k = pc.bit_wise_xor(k, pc.shift_right(k, _S33))
    k = pc.multiply(k, _M1)
    k = pc.bit_wise_xor(k, pc.shift_right(k, _S33))
    k = pc.multiply(k, _M2)
    return pc.bit_wise_xor(k, pc.shift_right(k, _S33))


def _hashes(keys: pa.Array) -> pa.Array:
    if pa.types.is_int64(keys.type):
        return _fmix64(pc.cast(keys, pa.uint64(), safe=False))
    if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type):
        return pa.array([zlib.crc32(key.encode()) for key in keys.to_pylist()], pa.uint64())
    raise errors.InvalidArgument(f"primary keys must be int64 or string, got {keys.type}")


def shards_of(keys: pa.Array | pa.ChunkedArray, shards: int) -> pa.Array:
    """The shard (0 ≤ s < ``shards``) of each key, as a uint64 array (pure).

    InvalidArgument for keys of another type or holding nulls.
    """
    if shards < 1:
        raise errors.InvalidArgument(f"shards must be at least 1, got {shards}")
    array = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    if array.null_count:
        raise errors.InvalidArgument(f"primary keys hold {array.null_count} null(s)")
    return pc.modulo(_hashes(array), pa.scalar(shards, pa.uint64()))


def split_by_shard(rows: pa.Table, key: str, shards: int) -> dict[int, pa.Table]:
    """``rows`` per shard of their ``key`` column, each in its input order (pure).

    Shards with no row are absent.
    """
    if rows.num_rows == 0:
        return {}
    assigned = shards_of(rows.column(key), shards)
    order = pc.sort_indices(assigned)  # stable: rows of a shard keep their order
    ordered = rows.take(order)
    grouped = pc.take(assigned, order)
    counts = pc.value_counts(grouped)
    out: dict[int, pa.Table] = {}
    offset = 0
    for item in sorted(counts.to_pylist(), key=lambda c: c["values"]):
        out[int(item["values"])] = ordered.slice(offset, item["counts"])
        offset += item["counts"]
    return out


def split_keys_by_shard(keys: pa.Array, shards: int) -> dict[int, pa.Array]:
    """``keys`` per shard, each in its input order (pure)."""
    table = pa.Table.from_arrays([keys], names=["key"])
    return {
        shard: part.column(0).combine_chunks()
        for shard, part in split_by_shard(table, "key", shards).items()
    }


def fitted(
    rows: pa.Table, max_bytes: int, build: Callable[[pa.Table], Message]
) -> Iterator[Message]:
    """Messages built from consecutive slices of ``rows``, each payload at most
    ``max_bytes`` (pure, given a pure ``build``).

    Slices are first sized from ``rows.nbytes``, then halved while their
    message's payload is too large. A single row larger than ``max_bytes`` is
    sent alone (the node refuses it as TOO_LARGE if it passes the node's limit).
    """
    if rows.num_rows == 0:
        return
    per_slice = max(1, rows.num_rows * max_bytes // max(1, rows.nbytes))
    for start in range(0, rows.num_rows, per_slice):
        yield from _halved(rows.slice(start, per_slice), max_bytes, build)


def _halved(
    rows: pa.Table, max_bytes: int, build: Callable[[pa.Table], Message]
) -> Iterator[Message]:
    message = build(rows)
    if rows.num_rows <= 1 or len(message.payload) <= max_bytes:
        yield message
        return
    half = rows.num_rows // 2
    yield from _halved(rows.slice(0, half), max_bytes, build)
    yield from _halved(rows.slice(half), max_bytes, build)
