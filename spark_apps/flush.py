"""The flush job: a pchannel's WAL range -> Parquet files -> one Iceberg commit.

    python -m spark_apps.flush --metastore URL --cluster C --pchannel P --term T \\
        --warehouse DIR|s3://bucket/prefix [--start POS] --end POS [--master local[2]]

1. The driver lists the collections whose shard vchannels live on the pchannel
   (collection records in the metastore, routing from the public client) and
   makes sure each has its Iceberg table (idempotent).
2. One Spark task per shard vchannel (:mod:`spark_apps.shard`): it reads
   ``(start, end]`` of its vchannel through the public consumer, applies the
   range's deletes to the rows before them, and writes each sealed segment's
   rows as Parquet files named after pchannel, term, segment and this run
   (never an existing name: a run cannot change a committed file).
   A range the checkpoint already records as committed is not read again.
3. The driver commits everything with :meth:`headrace.table.TableCatalog.commit_flush`
   under the launch term: segment records, table pointers and the checkpoint
   (at ``end``) in one metastore transaction.

Exit status: 0 committed (or already committed by an earlier run), 2 bad
input or malformed data in the range, 3 FENCED (the pchannel is under another
term: the new owner flushes the range), 4 CONFLICT (another flush moved the
checkpoint), 5 UNAVAILABLE (retry later), 1 anything else. The last line on
stdout is a JSON summary; an error is one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from headrace import errors
from headrace.client import HeadraceClient
from headrace.cluster import Keys
from headrace.message import ids
from headrace.metastore.contract import Metastore
from headrace.metastore.factory import open_metastore
from headrace.table import (
    CatalogConfig,
    CheckpointRecord,
    FlushCommit,
    FlushResult,
    ObjectStoreOptions,
    TableCatalog,
)
from headrace.table.collections import Collection, CollectionRecord, collections_prefix
from spark_apps.commits import plan_commits
from spark_apps.schedule import EXIT_CODES
from spark_apps.shard import RangeJob, ShardFailure, ShardResult, ShardTask, flush_shard

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("spark_apps.flush")


async def shard_tasks(job: RangeJob) -> list[ShardTask]:
    """One task per shard vchannel of every collection routed to the pchannel;
    none if the checkpoint says this range is already committed."""
    metastore = await open_metastore(job.metastore_url, create=False)
    try:
        async with HeadraceClient(job.metastore_url, job.cluster, metastore=metastore) as client:
            kv = await metastore.get(client.keys.checkpoint(job.pchannel))
            if kv is not None and covers(CheckpointRecord.from_json(kv.value), job):
                log.info("%s: (%s, %s] is already committed", job.pchannel, job.start, job.end)
                return []
            collections = await live_collections(metastore, client.keys)
            return [
                ShardTask(job, collection, vchannel)
                for collection in collections
                for vchannel in collection.vchannels
                if client.route(vchannel) == job.pchannel
            ]
    finally:
        await metastore.close()


async def live_collections(metastore: Metastore, keys: Keys) -> list[Collection]:
    """The collections not dropped: a record with a true ``dropped`` field
    stops flushing (tolerated absent: older records have no such field)."""
    items = await metastore.get_prefix(collections_prefix(keys))
    return [
        CollectionRecord.from_json(item.value).collection()
        for item in items
        if not json.loads(item.value).get("dropped")
    ]


def covers(checkpoint: CheckpointRecord, job: RangeJob) -> bool:
    """Whether ``checkpoint`` was written by a commit of exactly this range."""

    def same(a: str, b: str) -> bool:
        return a == b if not a or not b else ids.parse(a) == ids.parse(b)

    return (
        same(checkpoint.flush_start, job.start)
        and same(checkpoint.flush_end, job.end)
        and same(checkpoint.position, job.end)
    )


def run(job: RangeJob, master: str) -> FlushResult:
    """The whole job in a Spark session of its own; raises the Headrace error
    that stopped it."""
    started = time.monotonic()
    spark = spark_session(master)
    log.info("flush %s: Spark session ready in %.1fs", job.pchannel, time.monotonic() - started)
    try:
        return run_in(spark, job)
    finally:
        spark.stop()


def run_in(spark: SparkSession, job: RangeJob, group: str = "") -> FlushResult:
    """The whole job in a running session (the standalone's runner keeps one).

    ``group``: the Spark job group the tasks run in, so that a runner can
    cancel them (``cancelJobGroup``) when the flush passes its deadline.
    Several commits if the range has more segments than one commit holds
    (:func:`spark_apps.commits.plan_commits`); the result of the last.
    """
    started = time.monotonic()
    tasks = asyncio.run(shard_tasks(job))
    with TableCatalog.open(job.catalog) as catalog:
        for collection in {t.collection.name: t.collection for t in tasks}.values():
            catalog.create_table(collection.name, collection.schema, collection.primary_key)
        ready = time.monotonic()
        outputs = []
        if tasks:
            context = spark.sparkContext
            if group:
                context.setJobGroup(group, f"flush {job.pchannel}", interruptOnCancel=True)
            outputs = context.parallelize(tasks, len(tasks)).map(flush_shard).collect()
        failures = [o for o in outputs if isinstance(o, ShardFailure)]
        if failures:
            raise failures[0].error()
        results = [o for o in outputs if isinstance(o, ShardResult)]
        written = time.monotonic()
        for shard in results:
            log.info(
                "flush %s: %s read %.1fs, fold %.1fs, write %.1fs (%d rows)",
                job.pchannel,
                shard.vchannel,
                *shard.seconds,
                sum(s.rows for s in shard.segments),
            )
        commits = plan_commits(job, results) if tasks else (empty_commit(job),)
        result = None
        for commit in commits:
            result = catalog.commit_flush(commit)
    assert result is not None
    log.info(
        "flush %s (%s, %s]: prepare %.1fs, read+write %.1fs, %d commit(s) %.1fs",
        job.pchannel,
        job.start or "beginning",
        job.end,
        ready - started,
        written - ready,
        len(commits),
        time.monotonic() - written,
    )
    return result


def empty_commit(job: RangeJob) -> FlushCommit:
    """A range with no collection data: the checkpoint still moves past it."""
    return plan_commits(job, ())[0]


def spark_session(master: str) -> SparkSession:
    from pyspark.sql import SparkSession  # noqa: PLC0415 - only the job process needs the JVM

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master) if master else SparkSession.builder
    spark = (
        builder.appName("headrace-flush")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.task.maxFailures", "1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def parse_args(argv: Sequence[str]) -> tuple[RangeJob, str]:
    parser = argparse.ArgumentParser(
        prog="python -m spark_apps.flush", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--metastore", required=True, help="sqlite:///abs/meta.db or etcd://host:port"
    )
    parser.add_argument("--cluster", default="default")
    parser.add_argument("--pchannel", required=True)
    parser.add_argument(
        "--term", type=int, required=True, help="the owner term the job was launched under"
    )
    parser.add_argument(
        "--warehouse", required=True, help="an absolute directory or s3://bucket/prefix"
    )
    parser.add_argument(
        "--start", default="", help="the last checkpoint (exclusive); empty: the beginning"
    )
    parser.add_argument("--end", required=True, help="the last seal (inclusive)")
    parser.add_argument(
        "--master",
        default="local[2]",
        help="the Spark master; empty: the one spark-submit was given (a SparkApplication)",
    )
    parser.add_argument("--rows-per-file", type=int, default=1_000_000)
    parser.add_argument("--read-idle-timeout", type=float, default=60.0)
    parser.add_argument("--s3-endpoint", default=os.environ.get("HEADRACE_S3_ENDPOINT", ""))
    args = parser.parse_args(argv)
    if args.rows_per_file < 1:
        parser.error(f"--rows-per-file must be at least 1, got {args.rows_per_file}")
    store = ObjectStoreOptions.from_env(args.s3_endpoint)
    catalog = CatalogConfig(args.metastore, args.warehouse, args.cluster, store)
    job = RangeJob(
        cluster=args.cluster,
        metastore_url=args.metastore,
        pchannel=args.pchannel,
        term=args.term,
        start=args.start,
        end=args.end,
        catalog=catalog,
        attempt=uuid.uuid4().hex[:12],
        rows_per_file=args.rows_per_file,
        read_idle_timeout_s=args.read_idle_timeout,
    )
    return job, args.master


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    job, master = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        result = run(job, master)
    except errors.HeadraceError as exc:
        print(
            f"flush of {job.pchannel} ({job.start or 'beginning'}, {job.end}] under term "
            f"{job.term} failed: {exc}",
            file=sys.stderr,
        )
        return EXIT_CODES.get(exc.code, 1)
    summary = {
        "outcome": result.outcome.value,
        "checkpoint": result.checkpoint.position,
        "term": result.checkpoint.term,
        "metadata_locations": result.metadata_locations,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
