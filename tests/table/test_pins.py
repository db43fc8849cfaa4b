"""Reader pins as records (pure): keys, the pin transaction, decoding."""

from __future__ import annotations

import dataclasses

import pytest

from headrace import errors
from headrace.cluster import Keys
from headrace.metastore.contract import Compare, Get, KeyValue
from headrace.table.pins import (
    PinBasis,
    pin_epoch_key,
    pin_key,
    pin_ops,
    pinned_snapshots,
    pins_prefix,
    reader_pins_of,
    reader_pins_ops,
)
from headrace.table.records import collection_key, table_key

KEYS = Keys("c1")


def kv(key: str, value: bytes) -> KeyValue:
    return KeyValue(key=key, value=value, mod_revision=1, create_revision=1, version=1, lease=0)


def test_the_pin_is_put_under_its_lease_only_if_pointer_and_record_did_not_move() -> None:
    compares, puts = pin_ops(KEYS, "orders", 42, lease=0xABC, basis=PinBasis(17, 5))
    pointer, record = compares
    assert pointer == Compare.mod_revision_is(table_key(KEYS, "orders"), 17)
    assert record == Compare.mod_revision_is(collection_key(KEYS, "orders"), 5)
    put, epoch = puts
    assert put.key == pin_key(KEYS, "orders", 0xABC) and put.lease == 0xABC
    assert put.key.startswith(pins_prefix(KEYS) + "orders/")
    assert pinned_snapshots(KEYS, [kv(put.key, put.value)]) == {"orders": frozenset({42})}
    # The epoch outlives the pin (no lease) and is not read as a pin.
    assert epoch.key == pin_epoch_key(KEYS, "orders") and epoch.lease == 0
    assert not epoch.key.startswith(pins_prefix(KEYS))


def test_pins_of_several_readers_and_collections() -> None:
    found = [
        kv(put.key, put.value)
        for collection, snapshot, lease in [("a", 1, 1), ("a", 2, 2), ("a", 1, 3), ("b", 9, 4)]
        for put in pin_ops(KEYS, collection, snapshot, lease, PinBasis(1, 1))[1]
        if put.lease
    ]
    assert pinned_snapshots(KEYS, found) == {"a": frozenset({1, 2}), "b": frozenset({9})}
    assert pinned_snapshots(KEYS, []) == {}


def test_one_collections_pins_come_with_the_epoch_an_expiry_compares() -> None:
    epoch_op, pins_op = reader_pins_ops(KEYS, "a")
    assert epoch_op == Get(pin_epoch_key(KEYS, "a"))
    assert pins_op == Get(pins_prefix(KEYS) + "a/", prefix=True)
    pins = [
        kv(pin_key(KEYS, "a", lease), pin_ops(KEYS, "a", 7, lease, PinBasis(1, 1))[1][0].value)
        for lease in (1, 2)
    ]
    epoch = dataclasses.replace(kv(pin_epoch_key(KEYS, "a"), b"{}"), mod_revision=12)
    held = reader_pins_of(KEYS, "a", [[epoch], pins])
    assert held.snapshot_ids == frozenset({7})
    assert held.unchanged() == Compare.mod_revision_is(pin_epoch_key(KEYS, "a"), 12)
    never = reader_pins_of(KEYS, "a", [[], []])
    assert never.snapshot_ids == frozenset()
    # No pin ever taken: the epoch is absent, which mod_revision 0 compares.
    assert never.unchanged() == Compare.mod_revision_is(pin_epoch_key(KEYS, "a"), 0)
    assert never.unchanged().holds(None)
    assert not never.unchanged().holds(epoch)


@pytest.mark.parametrize("value", [b"", b"{}", b'{"snapshot_id": "x"}', b"[1]"])
def test_a_pin_that_does_not_decode_is_corrupt_not_ignored(value: bytes) -> None:
    with pytest.raises(errors.CorruptData, match="reader pin"):
        pinned_snapshots(KEYS, [kv(pin_key(KEYS, "a", 1), value)])


def test_a_bad_collection_name_is_refused() -> None:
    with pytest.raises(errors.InvalidArgument):
        pin_key(KEYS, "a/b", 1)
