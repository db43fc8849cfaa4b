"""The write stop's records on every metastore (SQLite, etcd, etcd with TLS)."""

from __future__ import annotations

import uuid

import pytest

from headrace import errors
from headrace.cluster import Keys
from headrace.coordinator import writestop
from headrace.metastore.contract import Metastore


@pytest.fixture
def keys() -> Keys:
    return Keys(f"ws-{uuid.uuid4().hex[:8]}")


async def test_stop_is_idempotent_acks_follow_leases_and_resume_clears_both(
    store: Metastore, keys: Keys
) -> None:
    assert (await writestop.read_stop(store, keys)).stop is None
    first = await writestop.stop_writes(store, keys, "  upgrade to v2 ", by="UpgradePlan a/b")
    assert first.stop is not None and first.stop.reason == "upgrade to v2"
    assert first.revision > 0
    again = await writestop.stop_writes(store, keys, "other", by="cli")
    assert (again.stop, again.revision) == (first.stop, first.revision), "the first stop stays"

    lease = await store.grant_lease(30)
    ack = writestop.WriteStopAck(node="n1", stop_revision=first.revision, in_flight=0)
    await store.put(writestop.ack_key(keys, "n1"), ack.to_json(), lease=lease)
    older = writestop.WriteStopAck(node="n2", stop_revision=first.revision - 1, in_flight=0)
    await store.put(writestop.ack_key(keys, "n2"), older.to_json())
    state = await writestop.read_stop(store, keys)
    assert state.acks == {"n1": ack, "n2": older}
    assert writestop.drained(state, ["n1"]) == ""
    assert writestop.drained(state, ["n1", "n2"]) == "n2 has not acknowledged the stop"
    await store.revoke_lease(lease)
    assert "n1" not in (await writestop.read_stop(store, keys)).acks, "a node's ack dies with it"

    assert await writestop.resume_writes(store, keys)
    state = await writestop.read_stop(store, keys)
    assert (state.stop, state.revision, dict(state.acks)) == (None, 0, {})
    assert not await writestop.resume_writes(store, keys), "nothing to resume"


async def test_bad_input_is_refused_and_a_malformed_record_is_corrupt(
    store: Metastore, keys: Keys
) -> None:
    with pytest.raises(errors.InvalidArgument):
        await writestop.stop_writes(store, keys, "   ")
    assert (await writestop.read_stop(store, keys)).stop is None, "nothing was stopped"
    await store.put(writestop.stop_key(keys), b"{not json")
    with pytest.raises(errors.CorruptData):
        await writestop.read_stop(store, keys)
    assert await writestop.resume_writes(store, keys), "a malformed stop can still be removed"
