"""One compaction round of one pchannel: the main file of the operator's
compaction SparkApplications.

``python -m spark_apps.compact_pchannel --metastore URL --cluster C --pchannel P
--warehouse DIR|s3://bucket/prefix [--s3-endpoint URL] [--master M]
[--min-small-files N] [--max-delete-ratio R] [--target-file-bytes B]
[--small-file-bytes B] [--max-input-files N]``

The shards it looks at are those of every live collection whose vchannel the
cluster's routing puts on ``P``; the same pure decision as the standalone's
flush runner (:func:`spark_apps.compact_schedule.next_compaction`) picks the
ones due, each compacted by :func:`spark_apps.compact.run_in` in this run's
Spark session (``--master ""`` leaves the master to spark-submit). Prints one
JSON line: every shard's decision and the compactions run. Exit codes as the
flush job's (2 bad input, 5 unavailable, ...), 4 when a compaction gave up.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from headrace import errors
from headrace.cluster import ClusterConfig, Keys
from headrace.metastore.factory import open_metastore
from headrace.table import CatalogConfig, ObjectStoreOptions, TableCatalog
from spark_apps.compact import CompactionResult, CompactJob, Outcome, run_in
from spark_apps.compact_schedule import Compact, CompactionPolicy, Failures, next_compaction
from spark_apps.compactor import Facts, read_facts, read_requests, shard_states
from spark_apps.flush import spark_session
from spark_apps.schedule import EXIT_CODES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("spark_apps.compact_pchannel")


@dataclasses.dataclass(frozen=True, slots=True)
class PChannelRound:
    catalog: CatalogConfig
    pchannel: str
    policy: CompactionPolicy


async def _read(job: PChannelRound) -> tuple[Facts, ClusterConfig]:
    keys = Keys(job.catalog.cluster)
    async with await open_metastore(job.catalog.metastore_url, create=False) as store:
        kv = await store.get(keys.config)
        if kv is None:
            raise errors.NotFound(f"cluster {job.catalog.cluster} has no config")
        facts = await read_facts(store, keys, await read_requests(store, keys))
    return facts, ClusterConfig.from_json(kv.value)


def due_here(job: PChannelRound, facts: Facts, config: ClusterConfig) -> list[Compact]:
    """The compactions due on the shards whose vchannels route to the pchannel
    (reads the tables)."""
    vchannels = {c.name: c.vchannels for c in facts.collections}
    with TableCatalog.open(job.catalog) as catalog:
        states = shard_states(catalog, facts, job.policy, {})
    steps = []
    for state in states:
        if config.route(vchannels[state.collection][state.shard]) != job.pchannel:
            continue
        step = next_compaction(state, job.policy, Failures(), time.time(), time.monotonic())
        log.info("%s-%d: %s", state.collection, state.shard, step.reason)
        if isinstance(step, Compact):
            steps.append(step)
    return steps


def parse_args(argv: Sequence[str]) -> tuple[PChannelRound, str]:
    parser = argparse.ArgumentParser(
        prog="python -m spark_apps.compact_pchannel", description=__doc__.split("\n")[0]
    )
    defaults = CompactionPolicy()
    parser.add_argument("--metastore", required=True)
    parser.add_argument("--cluster", default="default")
    parser.add_argument("--pchannel", required=True)
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--s3-endpoint", default=os.environ.get("HEADRACE_S3_ENDPOINT", ""))
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--min-small-files", type=int, default=defaults.min_small_files)
    parser.add_argument("--max-delete-ratio", type=float, default=defaults.max_delete_ratio)
    parser.add_argument("--target-file-bytes", type=int, default=defaults.target_file_bytes)
    parser.add_argument("--small-file-bytes", type=int, default=defaults.small_file_bytes)
    parser.add_argument("--max-input-files", type=int, default=defaults.max_input_files)
    args = parser.parse_args(argv)
    try:
        policy = CompactionPolicy(
            target_file_bytes=args.target_file_bytes,
            small_file_bytes=min(args.small_file_bytes, args.target_file_bytes),
            min_small_files=args.min_small_files,
            max_delete_ratio=args.max_delete_ratio,
            max_input_files=args.max_input_files,
        )
    except errors.InvalidArgument as exc:
        parser.error(str(exc))
    store = ObjectStoreOptions.from_env(args.s3_endpoint)
    catalog = CatalogConfig(args.metastore, args.warehouse, args.cluster, store)
    return PChannelRound(catalog, args.pchannel, policy), args.master


def run_round(job: PChannelRound, session: Callable[[], SparkSession]) -> list[CompactionResult]:
    """The round: the compactions due on the pchannel, each in the session
    ``session()`` gives (asked for only when one is due)."""
    facts, config = asyncio.run(_read(job))
    steps = due_here(job, facts, config)
    if not steps:
        return []
    spark = session()
    return [
        run_in(
            spark,
            CompactJob(
                catalog=job.catalog,
                collection=step.collection,
                shard=step.shard,
                run_id=uuid.uuid4().hex[:12],
                selection=step.selection,
                policy=job.policy,
            ),
        )
        for step in steps
    ]


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    job, master = parse_args(sys.argv[1:] if argv is None else argv)
    sessions: list[SparkSession] = []

    def session() -> SparkSession:
        sessions.append(spark_session(master))
        return sessions[-1]

    try:
        results = run_round(job, session)
    except errors.HeadraceError as exc:
        print(f"compaction of {job.pchannel} failed: {exc}", file=sys.stderr)
        return EXIT_CODES.get(exc.code, 1)
    finally:
        for spark in sessions:
            spark.stop()
    print(json.dumps({"pchannel": job.pchannel, "compactions": [r.summary() for r in results]}))
    gave_up = [r for r in results if r.outcome is Outcome.GAVE_UP]
    for r in gave_up:
        print(f"compaction gave up: {r.reason}", file=sys.stderr)
    return 4 if gave_up else 0


if __name__ == "__main__":
    sys.exit(main())
