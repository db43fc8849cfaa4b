"""The flush runner's compaction rounds (standalone).

Between two flushes, every ``interval_s`` (or at once when a
``headrace compact`` request is pending), the runner:

1. reads the live collections, the pending :class:`CompactionRequest` records,
   each shard's last :class:`ShardCompaction` and the rows the flushes wrote
   per shard (segment records), then each table's live files (pyiceberg, no
   Spark), and sums them up per shard (:class:`ShardState`);
2. decides per shard (:func:`spark_apps.compact_schedule.next_compaction`,
   pure, each hold says why);
3. runs the compaction job (:func:`spark_apps.compact.run_in`) in the
   runner's session, one shard at a time, under the flush deadline;
4. marks a request DONE once a round finds nothing left to compact in its
   collection, or FAILED with the error of a compaction that failed
   (comparing the record's revision: a newer request is never marked).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from headrace import errors
from headrace.cluster import Keys
from headrace.metastore.contract import Compare, KeyValue, Metastore, Put
from headrace.table import CatalogConfig, SegmentRecord, TableCatalog
from headrace.table.collections import Collection, CollectionRecord, collections_prefix
from headrace.table.compaction import live_files
from headrace.table.records import (
    CompactionRequest,
    CompactionState,
    ShardCompaction,
    compaction_requests_prefix,
    segments_root,
    shard_compactions_prefix,
)
from spark_apps import compact
from spark_apps.compact import CompactionResult, CompactJob, Outcome, shard_of_files
from spark_apps.compact_schedule import (
    Compact,
    CompactionPolicy,
    Failures,
    Hold,
    ShardState,
    after_failure,
    next_compaction,
)
from spark_apps.schedule import RetryPolicy

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_apps.runner import Ran

log = logging.getLogger("spark_apps.compactor")


@dataclasses.dataclass(frozen=True, slots=True)
class CompactorOptions:
    interval_s: float = 60.0
    """Seconds between two rounds (a pending request starts one at once)."""
    policy: CompactionPolicy = dataclasses.field(default_factory=CompactionPolicy)
    retry: RetryPolicy = dataclasses.field(default_factory=RetryPolicy)


@dataclasses.dataclass(frozen=True, slots=True)
class Facts:
    """What the metastore says, read in one pass."""

    collections: tuple[Collection, ...]
    requests: dict[str, KeyValue]
    """Collection -> its PENDING request's key-value."""
    compactions: dict[tuple[str, int], ShardCompaction]
    flushed: dict[str, int]
    """Vchannel -> rows its flushes wrote."""


async def read_requests(metastore: Metastore, keys: Keys) -> dict[str, KeyValue]:
    """Collection -> its PENDING request's key-value."""
    requests = {}
    for kv in await metastore.get_prefix(compaction_requests_prefix(keys)):
        request = CompactionRequest.from_json(kv.value)
        if request.state is CompactionState.PENDING:
            requests[request.collection] = kv
    return requests


async def read_facts(metastore: Metastore, keys: Keys, requests: dict[str, KeyValue]) -> Facts:
    collections = tuple(
        CollectionRecord.from_json(kv.value).collection()
        for kv in await metastore.get_prefix(collections_prefix(keys))
        if not json.loads(kv.value).get("dropped")
    )
    compactions = {}
    for kv in await metastore.get_prefix(shard_compactions_prefix(keys)):
        record = ShardCompaction.from_json(kv.value)
        compactions[(record.collection, record.shard)] = record
    flushed: dict[str, int] = {}
    for kv in await metastore.get_prefix(segments_root(keys)):
        segment = SegmentRecord.from_json(kv.value)
        flushed[segment.vchannel] = flushed.get(segment.vchannel, 0) + segment.rows
    return Facts(collections, requests, compactions, flushed)


def shard_states(
    catalog: TableCatalog, facts: Facts, policy: CompactionPolicy, cache: dict[str, int]
) -> list[ShardState]:
    """Every shard of every live collection that has a table (blocking I/O)."""
    tables = set(catalog.collections())
    states: list[ShardState] = []
    for collection in facts.collections:
        if collection.name not in tables:
            continue
        files = live_files(catalog, collection.name)
        of = shard_of_files(catalog, files, collection.spec.shards, cache)
        for shard, vchannel in enumerate(collection.vchannels):
            mine = [f for f in files.files if of[f.path] == shard]
            small = [f for f in mine if f.bytes < policy.small_file_bytes]
            live = sum(f.rows for f in mine)
            last = facts.compactions.get((collection.name, shard))
            difference = facts.flushed.get(vchannel, 0) - live
            states.append(
                ShardState(
                    collection=collection.name,
                    shard=shard,
                    files=len(mine),
                    small_files=len(small),
                    live_rows=live,
                    deleted_rows=difference - (0 if last is None else last.deleted),
                    oldest_small_at_s=min((f.added_at_s for f in small), default=None),
                    requested=collection.name in facts.requests,
                )
            )
    return states


Guarded = Callable[
    [Callable[[str], CompactionResult], str, str], Awaitable["Ran[CompactionResult]"]
]
"""Runs ``work(group)`` under the runner's deadline (``FlushRunner.guarded``)."""


class Compactor:
    def __init__(
        self, options: CompactorOptions, catalog: CatalogConfig, metastore: Metastore, keys: Keys
    ) -> None:
        self.options = options
        self.catalog = catalog
        self.metastore = metastore
        self.keys = keys
        self.failures: dict[tuple[str, int], Failures] = {}
        self.due = 0.0
        """``time.monotonic()`` of the next round (a pending request makes it now)."""
        self.rounds = 0
        self._reasons: dict[tuple[str, int], str] = {}
        self._cache: dict[str, int] = {}

    async def round(
        self,
        session: Callable[[], Awaitable[SparkSession]],
        guarded: Guarded,
    ) -> list[CompactionResult]:
        """One round if due or requested (see the module docstring); the
        compactions it ran (NOTHING_TO_DO included)."""
        try:
            requests = await read_requests(self.metastore, self.keys)
            if time.monotonic() < self.due and not requests:
                return []
            facts = await read_facts(self.metastore, self.keys, requests)
        except errors.HeadraceError as exc:
            log.warning("compaction: cannot read the records (next round): %s", exc)
            self.due = time.monotonic() + self.options.interval_s
            return []
        self.due = time.monotonic() + self.options.interval_s
        self.rounds += 1
        try:
            states = await asyncio.to_thread(self._states, facts)
        except errors.HeadraceError as exc:
            log.warning("compaction: cannot read the tables (next round): %s", exc)
            return []
        steps = [
            next_compaction(
                s,
                self.options.policy,
                self.failures.get((s.collection, s.shard), Failures()),
                time.time(),
                time.monotonic(),
            )
            for s in states
        ]
        self._report(steps)
        ran: list[CompactionResult] = []
        failed: dict[str, str] = {}
        for step in steps:
            if isinstance(step, Compact):
                result = await self._compact(step, session, guarded)
                if isinstance(result, CompactionResult):
                    ran.append(result)
                else:
                    failed.setdefault(step.collection, result)
        # A request is served once a round commits nothing more in its collection.
        busy = {r.collection for r in ran if r.outcome is Outcome.COMMITTED}
        for collection, kv in facts.requests.items():
            if collection in failed:
                await self._settle(kv, CompactionState.FAILED, failed[collection])
            elif collection not in busy:
                await self._settle(kv, CompactionState.DONE, "nothing left to compact")
        return ran

    def _states(self, facts: Facts) -> list[ShardState]:
        with TableCatalog.open(self.catalog) as catalog:
            return shard_states(catalog, facts, self.options.policy, self._cache)

    def _report(self, steps: Sequence[Compact | Hold]) -> None:
        for step in steps:
            key = (step.collection, step.shard)
            if self._reasons.get(key) != step.reason:
                self._reasons[key] = step.reason
                verb = "compacting" if isinstance(step, Compact) else "not compacting"
                log.info("%s-%d: %s: %s", step.collection, step.shard, verb, step.reason)

    async def _compact(
        self,
        step: Compact,
        session: Callable[[], Awaitable[SparkSession]],
        guarded: Guarded,
    ) -> CompactionResult | str:
        """One shard's compaction; its result, or the error that stopped it."""
        key = (step.collection, step.shard)
        job = CompactJob(
            catalog=self.catalog,
            collection=step.collection,
            shard=step.shard,
            run_id=uuid.uuid4().hex[:12],
            selection=step.selection,
            policy=self.options.policy,
        )
        error: errors.HeadraceError
        try:
            spark = await session()
            ran = await guarded(
                lambda group: compact.run_in(spark, job, group),
                f"headrace-compact-{step.collection}-{step.shard}-{job.run_id[:8]}",
                f"the compaction of {step.collection}-{step.shard}",
            )
        except errors.Unavailable as exc:
            error = exc
        else:
            exc_or_none = ran.future.exception()
            if exc_or_none is None and not ran.cancelled:
                result = ran.future.result()
                self.failures.pop(key, None)
                log.info(
                    "%s-%d: compaction %s: %d files -> %d (%d rows) in %d plan(s)%s",
                    step.collection,
                    step.shard,
                    result.outcome.value,
                    result.inputs,
                    result.outputs,
                    result.rows,
                    result.plans,
                    f": {result.reason}" if result.reason else "",
                )
                if result.outcome is Outcome.GAVE_UP:
                    error = errors.Conflict(result.reason, retryable=True)
                else:
                    return result
            elif isinstance(exc_or_none, errors.HeadraceError):
                error = exc_or_none
            elif exc_or_none is None:
                error = errors.Unavailable("the compaction passed its deadline")
            else:
                error = errors.Unavailable(f"the Spark job failed: {exc_or_none}")
        history = after_failure(
            self.failures.get(key, Failures()), error, time.monotonic(), self.options.retry
        )
        self.failures[key] = history
        log.warning("%s-%d: compaction failed: %s", step.collection, step.shard, error)
        return str(error)

    async def _settle(self, kv: KeyValue, state: CompactionState, message: str) -> None:
        request = CompactionRequest.from_json(kv.value)
        done = request.model_copy(
            update={"state": state, "message": message, "done_at": time.time()}
        )
        try:
            await self.metastore.txn(
                [Compare.mod_revision_is(kv.key, kv.mod_revision)], [Put(kv.key, done.to_json())]
            )
        except errors.HeadraceError as exc:
            log.warning("%s: cannot record the request's end (next round): %s", kv.key, exc)
            return
        log.info(
            "compaction request %s of %s: %s", request.request_id, request.collection, state.value
        )
