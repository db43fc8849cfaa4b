"""Reader pins: the table snapshots open reads use, kept from expiry and compaction.

A snapshot read records ``<root>/reader-pins/<collection>/<lease id>`` holding
the snapshot id, under a metastore lease it keeps alive while it reads: a
reader that dies without unpinning loses its pin when the lease runs out.
:func:`pinned_snapshots` decodes them for whoever deletes files (snapshot
expiry, compaction), which pass them as the ``pinned`` ids of
:func:`headrace.table.expiry.snapshots_to_expire` (through
:func:`headrace.table.maintenance.maintain`): a pinned snapshot is retained,
so its files stay referenced and are never collected.

The pin is written in a transaction comparing the table pointer's
``mod_revision`` with the one the read planned on: the snapshot is then part
of the table's metadata when the pin appears, so an expiry planned afterwards
sees both (see docs/pipeline.md, "Snapshot reads", for the one window left).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

from headrace import errors
from headrace.cluster import Keys
from headrace.metastore.contract import Compare, KeyValue, Put
from headrace.table.records import table_key

PIN_TTL_S = 30.0
"""Lease of a pin; a reading client renews it every third of this."""


def pins_prefix(keys: Keys) -> str:
    return f"{keys.root}/reader-pins/"


def pin_key(keys: Keys, collection: str, lease: int) -> str:
    table_key(keys, collection)  # the same name check
    return f"{pins_prefix(keys)}{collection}/{lease:016x}"


def pin_ops(
    keys: Keys, collection: str, snapshot_id: int, lease: int, pointer_revision: int
) -> tuple[list[Compare], list[Put]]:
    """The transaction that pins ``snapshot_id`` if the table pointer is still
    at ``pointer_revision``."""
    value = json.dumps({"snapshot_id": snapshot_id, "since": time.time()}).encode()
    return (
        [Compare.mod_revision_is(table_key(keys, collection), pointer_revision)],
        [Put(pin_key(keys, collection, lease), value, lease=lease)],
    )


def pinned_snapshots(keys: Keys, kvs: Iterable[KeyValue]) -> dict[str, frozenset[int]]:
    """Collection -> the snapshot ids readers hold (pure; ``kvs`` from the
    prefix). A record that does not decode is CORRUPT_DATA: deleting files
    on a guess could pull them from under a reader."""
    found: dict[str, set[int]] = {}
    prefix = pins_prefix(keys)
    for kv in kvs:
        collection, _, _ = kv.key.removeprefix(prefix).partition("/")
        try:
            snapshot_id = int(json.loads(kv.value)["snapshot_id"])
        except (ValueError, KeyError, TypeError):
            raise errors.CorruptData(f"reader pin {kv.key} does not decode: {kv.value!r}") from None
        found.setdefault(collection, set()).add(snapshot_id)
    return {collection: frozenset(ids) for collection, ids in found.items()}
