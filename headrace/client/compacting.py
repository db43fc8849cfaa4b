"""``client.compact``: a compaction request in the metastore, and waiting for it.

The client writes a :class:`~headrace.table.records.CompactionRequest` (a new
``request_id``, PENDING) at ``<root>/compactions/requests/<collection>``; the
flush runner (standalone) picks it up, compacts every shard of the collection
and sets the record DONE, or FAILED with the error. A later request replaces
an earlier one; a waiter whose request was replaced waits for the newer one
(it covers everything the older one asked for). :func:`settled` is pure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
import uuid

from headrace import errors
from headrace.cluster import Keys
from headrace.metastore.contract import Metastore
from headrace.table.records import CompactionRequest, CompactionState, compaction_request_key


@dataclasses.dataclass(frozen=True, slots=True)
class CompactOutcome:
    collection: str
    request_id: str
    state: CompactionState
    message: str
    waited: bool

    def describe(self) -> dict[str, object]:
        return {
            "collection": self.collection,
            "request_id": self.request_id,
            "state": self.state.value,
            "message": self.message,
            "waited": self.waited,
        }


async def request_compaction(
    metastore: Metastore, keys: Keys, collection: str
) -> CompactionRequest:
    """Record a new PENDING request for ``collection`` (replacing any earlier one)."""
    request = CompactionRequest(
        collection=collection, request_id=uuid.uuid4().hex[:16], requested_at=time.time()
    )
    await metastore.put(compaction_request_key(keys, collection), request.to_json())
    return request


def settled(
    mine: CompactionRequest, found: CompactionRequest | None
) -> CompactionRequest | errors.HeadraceError | None:
    """What ends the wait for ``mine`` (the DONE record, or the error to
    raise), or None to keep waiting.

    ``found`` is the record now: mine or a later request that replaced it
    (followed: it covers mine). None at all (deleted by hand) or an older
    request than mine is NOT_FOUND: nobody will serve mine.
    """
    replaced_by_older = found is not None and (
        found.request_id != mine.request_id and found.requested_at < mine.requested_at
    )
    if found is None or replaced_by_older:
        return errors.NotFound(
            f"the compaction request {mine.request_id} of {mine.collection} is gone"
        )
    if found.state is CompactionState.PENDING:
        return None
    if found.state is CompactionState.FAILED:
        return errors.Unavailable(f"the compaction of {mine.collection} failed: {found.message}")
    return found


async def wait_compacted(
    metastore: Metastore,
    keys: Keys,
    request: CompactionRequest,
    timeout: float | None,
    poll_s: float = 0.5,
) -> CompactionRequest:
    """Poll until the request is DONE (returned) or FAILED (UNAVAILABLE with
    the runner's message); UNAVAILABLE after ``timeout`` seconds (None: no limit)."""
    key = compaction_request_key(keys, request.collection)
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    while True:
        kv = await metastore.get(key)
        found = None if kv is None else CompactionRequest.from_json(kv.value)
        done = settled(request, found)
        if isinstance(done, errors.HeadraceError):
            raise done
        if done is not None:
            return done
        if time.monotonic() >= deadline:
            raise errors.Unavailable(
                f"the compaction of {request.collection} was not done within {timeout}s "
                "(is a flush runner serving this cluster?)"
            )
        await asyncio.sleep(min(poll_s, max(deadline - time.monotonic(), 0.0)))
