"""Pure helpers shared by the metastore implementations: key ranges and
request validation (the rules etcd applies, so both stores reject the same
requests with the same error)."""

from __future__ import annotations

from collections.abc import Sequence

from headrace import errors
from headrace.metastore.contract import Compare, Delete, Op, Put, Target


def encode_key(key: str, *, prefix: bool = False) -> bytes:
    """UTF-8 bytes of ``key``; only a prefix may be empty (it means every key)."""
    if not isinstance(key, str):
        raise errors.InvalidArgument(f"metastore keys are strings, got {type(key).__name__}")
    if not key and not prefix:
        raise errors.InvalidArgument("empty metastore key")
    return key.encode()


def prefix_end(prefix: bytes) -> bytes | None:
    """Exclusive upper bound of the keys starting with ``prefix``.

    ``None`` means "no upper bound" (the empty prefix, or one made only of
    0xff bytes, covers every key from ``prefix`` on).
    """
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def in_range(key: bytes, start: bytes, end: bytes | None) -> bool:
    return key >= start and (end is None or key < end)


def check_compare(compare: Compare) -> None:
    """Value compares take bytes, every other target an integer."""
    wants_bytes = compare.target is Target.VALUE
    if isinstance(compare.value, bytes) != wants_bytes or isinstance(compare.value, bool):
        kind = "bytes" if wants_bytes else "an integer"
        raise errors.InvalidArgument(
            f"compare of {compare.target.value} on {compare.key!r} needs {kind}, "
            f"got {compare.value!r}"
        )
    encode_key(compare.key)


def check_lease_ttl(ttl: float) -> None:
    if not ttl > 0:
        raise errors.InvalidArgument(f"lease TTL must be positive, got {ttl!r}")


def check_ops(ops: Sequence[Op]) -> None:
    """One branch of a transaction may write a key only once.

    Like etcd: a key may not be put twice, nor put and deleted, in one branch;
    overlapping deletes and any gets are fine.
    """
    puts: set[bytes] = set()
    deletes: list[tuple[bytes, bytes | None, bool]] = []
    for op in ops:
        key = encode_key(op.key, prefix=not isinstance(op, Put) and op.prefix)
        if isinstance(op, Put):
            if not isinstance(op.value, bytes):
                raise errors.InvalidArgument(f"value of {op.key!r} must be bytes")
            if key in puts:
                raise errors.InvalidArgument(f"key {op.key!r} is put twice in one transaction")
            puts.add(key)
        elif isinstance(op, Delete):
            deletes.append((key, prefix_end(key), op.prefix))
    for key in puts:
        for start, end, prefix in deletes:
            if (prefix and in_range(key, start, end)) or (not prefix and key == start):
                raise errors.InvalidArgument(
                    f"key {key.decode()!r} is both put and deleted in one transaction"
                )
