"""Reader pins: the table snapshots open reads use, kept from expiry and compaction.

A snapshot read records ``<root>/reader-pins/<collection>/<lease id>`` holding
the snapshot id, under a metastore lease it keeps alive while it reads: a
reader that dies without unpinning loses its pin when the lease runs out.
:func:`reader_pins_of` decodes one collection's for snapshot expiry
(:func:`headrace.table.maintenance.maintain` reads them itself for each plan
and passes them to :func:`headrace.table.expiry.snapshots_to_expire`): a
pinned snapshot is retained, so its files stay referenced and orphan
collection never deletes them. :func:`pinned_snapshots` decodes every
collection's (tools, tests).

The pin is written in a transaction comparing the table pointer's and the
collection record's ``mod_revision`` with those the read planned on
(:class:`PinBasis`): the snapshot is then part of the table's metadata when
the pin appears, and the collection was not dropped. The same transaction writes the
collection's **pin epoch** (``<root>/reader-pin-epochs/<collection>``), and an
expiry reads the pins with the epoch (:class:`ReaderPins`, one transaction)
and commits only if the epoch has not moved since (:meth:`ReaderPins.unchanged`
in the pointer swap). So an expiry either saw a pin, or the pin was written
after the expiry committed, when the pointer had moved and the pinned snapshot
was one the expiry kept: no file a pin needs is ever collected. Without the
epoch, a read that pinned between an expiry's reading of the pins and its
commit lost its snapshot's files (docs/pipeline.md, "Snapshot reads").

The epoch is the one pin key without a lease: the drop of the collection
deletes it in the transaction that marks the record dropped, and as a pin
compares the record, no pin written after the drop can put it back. An
expiry that read the epoch before the drop compares a revision the deleted
key no longer has, so it does not commit on the strength of those pins (a
dropped collection is not expired anyway: its files are collected whole).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Sequence

from headrace import errors
from headrace.cluster import Keys
from headrace.metastore.contract import Compare, Get, KeyValue, Put
from headrace.table.records import collection_key, table_key

PIN_TTL_S = 30.0
"""Lease of a pin; a reading client renews it every third of this."""


def pins_prefix(keys: Keys) -> str:
    return f"{keys.root}/reader-pins/"


def collection_pins_prefix(keys: Keys, collection: str) -> str:
    table_key(keys, collection)  # the same name check
    return f"{pins_prefix(keys)}{collection}/"


def pin_key(keys: Keys, collection: str, lease: int) -> str:
    return f"{collection_pins_prefix(keys, collection)}{lease:016x}"


def pin_epochs_prefix(keys: Keys) -> str:
    return f"{keys.root}/reader-pin-epochs/"


def pin_epoch_key(keys: Keys, collection: str) -> str:
    """Written by every pin of ``collection``: an expiry compares its
    ``mod_revision`` to know that no pin appeared since it read them.
    Deleted with the drop of the collection (:meth:`CollectionStore.drop
    <headrace.table.collections.CollectionStore.drop>`)."""
    table_key(keys, collection)  # the same name check
    return f"{pin_epochs_prefix(keys)}{collection}"


@dataclasses.dataclass(frozen=True, slots=True)
class PinBasis:
    """What a read planned on: the ``mod_revision`` of the table pointer and
    of the collection's record (0: absent), read in one transaction."""

    table_revision: int
    collection_revision: int


def pin_ops(
    keys: Keys, collection: str, snapshot_id: int, lease: int, basis: PinBasis
) -> tuple[list[Compare], list[Put]]:
    """The transaction that pins ``snapshot_id`` if neither the table pointer
    nor the collection's record moved since the read planned (a drop moves
    the record: a read that planned before it cannot write the epoch the
    drop deleted), and moves the collection's pin epoch."""
    value = json.dumps({"snapshot_id": snapshot_id, "since": time.time()}).encode()
    return (
        [
            Compare.mod_revision_is(table_key(keys, collection), basis.table_revision),
            Compare.mod_revision_is(collection_key(keys, collection), basis.collection_revision),
        ],
        [
            Put(pin_key(keys, collection, lease), value, lease=lease),
            Put(pin_epoch_key(keys, collection), value),
        ],
    )


@dataclasses.dataclass(frozen=True, slots=True)
class ReaderPins:
    """The snapshots readers of one collection hold, read with the pin epoch."""

    snapshot_ids: frozenset[int]
    epoch_key: str
    epoch_revision: int
    """``mod_revision`` of the epoch when the pins were read (0: no pin ever)."""

    def unchanged(self) -> Compare:
        """The condition that no pin was taken since these were read: a commit
        that drops snapshots on the strength of these pins compares it."""
        return Compare.mod_revision_is(self.epoch_key, self.epoch_revision)


def reader_pins_ops(keys: Keys, collection: str) -> list[Get]:
    """The reads of :func:`reader_pins_of`, to run in one transaction."""
    prefix = collection_pins_prefix(keys, collection)
    return [Get(pin_epoch_key(keys, collection)), Get(prefix, prefix=True)]


def reader_pins_of(keys: Keys, collection: str, found: Sequence[Sequence[KeyValue]]) -> ReaderPins:
    """``collection``'s pins from the results of :func:`reader_pins_ops` (pure)."""
    epoch, pins = found
    held = pinned_snapshots(keys, pins).get(collection, frozenset())
    revision = epoch[0].mod_revision if epoch else 0
    return ReaderPins(held, pin_epoch_key(keys, collection), revision)


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
