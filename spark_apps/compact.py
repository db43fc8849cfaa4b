"""The compaction job: one collection shard's small files -> files of a target
size sorted by primary key -> one Iceberg replace.

    python -m spark_apps.compact --metastore URL --cluster C --warehouse DIR|s3://bucket/prefix \\
        --collection NAME --shard I [--selection small|all] [--target-file-bytes N] \\
        [--small-file-bytes N] [--max-input-files N] [--replans N] [--master local[2]]

1. The driver lists the live data files of the table's current snapshot and
   the shard each belongs to (every file holds the rows of one shard: a flush
   writes a file per segment of one shard vchannel, a delete's rewrite keeps a
   subset of a file, and a compaction merges files of one shard; the shard of
   the file's smallest key, from the manifest or, for a possibly truncated
   string bound, from the file). It takes the shard's candidate files (small
   ones, or every file below the target size), oldest first, at most
   ``--max-input-files``, sorted by their smallest key and packed into bins of
   at most ``--target-file-bytes``; a bin of one file is left alone.
2. One Spark task per bin (:func:`compact_bin`, in a Python worker): read the
   bin's files with pyarrow, sort the rows by primary key and write one
   Parquet file (named after the shard, this run and the bin: never an
   existing name).
3. The driver commits with :func:`headrace.table.compaction.replace_files`:
   one overwrite snapshot conditioned on every input still being live. If a
   commit in between (a flush's delete) replaced an input, nothing is
   committed and the job plans and writes again from the new snapshot, up to
   ``--replans`` times, then gives up (outcome GAVE_UP, exit 4): the table is
   unchanged and its written files are orphans for the maintenance round.
   After a commit it records the shard's :class:`ShardCompaction` (the
   delete-ratio trigger's baseline).

Deletes: a flush applies its deletes by rewriting the committed files that
hold the keys (copy-on-write, docs/pipeline.md), so the live files hold no
deleted row; the compaction keeps it so by never committing rows read from a
file that is no longer live.

Exit status: 0 committed or nothing to do (last stdout line: a JSON summary),
2 bad input, 4 gave up (inputs kept changing, or CONFLICT), 5 UNAVAILABLE, 1
anything else.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import enum
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import PyArrowFileIO

from headrace import errors
from headrace.client.routing import shards_of
from headrace.cluster import Keys
from headrace.metastore.factory import open_metastore
from headrace.table import CatalogConfig, ObjectStoreOptions, SegmentRecord, TableCatalog
from headrace.table.collections import CollectionStore
from headrace.table.compaction import (
    LiveFile,
    ReplaceOutcome,
    TableFiles,
    files_of,
    live_files,
    replace_files,
)
from headrace.table.records import (
    PrimaryKey,
    ShardCompaction,
    segments_root,
    shard_compaction_key,
)
from spark_apps.compact_schedule import CompactionPolicy, Selection
from spark_apps.flush import spark_session
from spark_apps.schedule import EXIT_CODES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("spark_apps.compact")


@dataclasses.dataclass(frozen=True, slots=True)
class CompactJob:
    """One run of the compaction of one shard (the job's options)."""

    catalog: CatalogConfig
    collection: str
    shard: int
    run_id: str
    """Unique per run: part of every file name."""
    selection: Selection = Selection.SMALL
    policy: CompactionPolicy = dataclasses.field(default_factory=CompactionPolicy)
    replans: int = 3
    """Plans after the first when an input stopped being live before the commit."""


@dataclasses.dataclass(frozen=True, slots=True)
class Bin:
    inputs: tuple[LiveFile, ...]

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.inputs)


@dataclasses.dataclass(frozen=True, slots=True)
class BinTask:
    job: CompactJob
    plan: int
    index: int
    primary_key: str
    inputs: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class BinResult:
    index: int
    path: str
    rows: int
    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class BinFailure:
    index: int
    code: str
    message: str
    retryable: bool

    def error(self) -> errors.HeadraceError:
        error = errors.error_class(errors.ErrorCode(self.code))(f"bin {self.index}: {self.message}")
        error.retryable = self.retryable
        return error


class Outcome(enum.Enum):
    COMMITTED = "COMMITTED"
    NOTHING_TO_DO = "NOTHING_TO_DO"
    GAVE_UP = "GAVE_UP"


@dataclasses.dataclass(frozen=True, slots=True)
class CompactionResult:
    collection: str
    shard: int
    outcome: Outcome
    inputs: int = 0
    outputs: int = 0
    rows: int = 0
    snapshot_id: int | None = None
    plans: int = 0
    commit_attempts: int = 0
    reason: str = ""
    metadata_location: str = ""

    def summary(self) -> dict[str, object]:
        """The result as JSON-ready values."""
        return {field.name: _plain(getattr(self, field.name)) for field in dataclasses.fields(self)}


def _plain(value: object) -> object:
    return value.value if isinstance(value, enum.Enum) else value


# -- planning (pure) ----------------------------------------------------------


def candidates(
    files: Iterable[LiveFile], selection: Selection, policy: CompactionPolicy
) -> list[LiveFile]:
    """The files a run may take, oldest first, at most ``max_input_files``."""
    limit = policy.small_file_bytes if selection is Selection.SMALL else policy.target_file_bytes
    small = [f for f in files if f.bytes < limit]
    small.sort(key=lambda f: (f.added_at_s, f.path))
    return small[: policy.max_input_files]


def plan_bins(files: Sequence[LiveFile], target_file_bytes: int) -> tuple[Bin, ...]:
    """``files`` by smallest key, packed into bins of at most ``target_file_bytes``;
    a last bin of one file joins the one before it, a lone file is left alone."""
    ordered = sorted(files, key=_key_order)
    bins: list[list[LiveFile]] = []
    size = 0
    for f in ordered:
        if bins and size + f.bytes <= target_file_bytes:
            bins[-1].append(f)
            size += f.bytes
        else:
            bins.append([f])
            size = f.bytes
    if len(bins) >= 2 and len(bins[-1]) == 1 and size + _bytes(bins[-2]) <= 2 * target_file_bytes:
        bins[-2].extend(bins.pop())
    return tuple(Bin(tuple(b)) for b in bins if len(b) >= 2)


def _bytes(files: Iterable[LiveFile]) -> int:
    return sum(f.bytes for f in files)


def _key_order(f: LiveFile) -> tuple[bool, str, int, str]:
    key = f.lower_key
    return (
        key is None,
        key if isinstance(key, str) else "",
        key if isinstance(key, int) else 0,
        f.path,
    )


# -- shards of files ----------------------------------------------------------


def shard_of_files(
    catalog: TableCatalog, files: TableFiles, shards: int, cache: dict[str, int] | None = None
) -> dict[str, int]:
    """Path -> shard of every live file: the shard of its smallest key (read
    from the file when the manifest's bound may be truncated). ``cache``: paths
    already known (a file's shard never changes)."""
    known = {} if cache is None else cache
    keys: dict[str, PrimaryKey] = {}
    for f in files.files:
        if f.path in known:
            continue
        if f.lower_key is not None and f.lower_key_exact:
            keys[f.path] = f.lower_key
        else:
            keys[f.path] = _first_key(catalog, f.path, files.primary_key)
    if keys:
        values = list(keys.values())
        array = pa.array(values, pa.string() if isinstance(values[0], str) else pa.int64())
        for path, shard in zip(keys, shards_of(array, shards).to_pylist(), strict=True):
            known[path] = int(shard)
    return {f.path: known[f.path] for f in files.files}


def _first_key(catalog: TableCatalog, path: str, primary_key: str) -> PrimaryKey:
    io = PyArrowFileIO(catalog.warehouse.io_properties())

    def read() -> PrimaryKey:
        with io.new_input(path).open() as stream:
            column = pq.ParquetFile(stream).read_row_group(0, columns=[primary_key]).column(0)
        value = column[0].as_py()
        if not isinstance(value, int | str):
            raise errors.CorruptData(f"{path}: primary key {primary_key} holds {value!r}")
        return value

    return catalog.storage(f"reading the first key of {path}", read)


# -- the task (a Spark Python worker) -----------------------------------------


def output_name(task: BinTask) -> str:
    job = task.job
    return f"compact-{job.collection}-s{job.shard}-{job.run_id}-p{task.plan}-b{task.index:05d}"


def compact_bin(task: BinTask) -> BinResult | BinFailure:
    """Read the bin's files, sort their rows by primary key, write one file."""
    started = time.monotonic()
    try:
        with TableCatalog.open(task.job.catalog) as catalog:
            table = catalog.iceberg_table(task.job.collection)
            schema = table.schema().as_arrow()

            def read() -> pa.Table:
                parts = []
                for path in task.inputs:
                    with table.io.new_input(path).open() as stream:
                        parts.append(pq.read_table(stream).select(schema.names).cast(schema))
                return pa.concat_tables(parts)

            rows = catalog.storage(f"reading bin {task.index}", read).sort_by(task.primary_key)
            path = catalog.write_data_file(task.job.collection, rows, output_name(task))
    except errors.HeadraceError as exc:
        return BinFailure(task.index, exc.code.value, exc.message, exc.retryable)
    return BinResult(task.index, path, rows.num_rows, time.monotonic() - started)


# -- the driver ---------------------------------------------------------------


async def _shard_facts(job: CompactJob) -> tuple[int, int]:
    """The collection's shard count and the rows its flushes wrote to this shard."""
    keys = Keys(job.catalog.cluster)
    metastore = await open_metastore(job.catalog.metastore_url, create=False)
    try:
        collection = await CollectionStore(metastore, keys).get(job.collection)
        if not 0 <= job.shard < collection.spec.shards:
            raise errors.InvalidArgument(
                f"collection {job.collection} has shards 0..{collection.spec.shards - 1}, "
                f"not {job.shard}"
            )
        vchannel = collection.vchannels[job.shard]
        flushed = 0
        for kv in await metastore.get_prefix(segments_root(keys)):
            record = SegmentRecord.from_json(kv.value)
            if record.vchannel == vchannel:
                flushed += record.rows
        return collection.spec.shards, flushed
    finally:
        await metastore.close()


async def _record(job: CompactJob, record: ShardCompaction) -> None:
    metastore = await open_metastore(job.catalog.metastore_url, create=False)
    try:
        key = shard_compaction_key(Keys(job.catalog.cluster), job.collection, job.shard)
        await metastore.put(key, record.to_json())
    finally:
        await metastore.close()


def run(job: CompactJob, master: str) -> CompactionResult:
    """The job in a Spark session of its own."""
    spark = spark_session(master)
    try:
        return run_in(spark, job)
    finally:
        spark.stop()


def run_in(spark: SparkSession, job: CompactJob, group: str = "") -> CompactionResult:
    """The job in a running session (the runner keeps one); ``group``: the
    Spark job group its tasks run in (so that a runner can cancel them)."""
    started = time.monotonic()
    shards, _ = asyncio.run(_shard_facts(job))
    cache: dict[str, int] = {}
    reason = ""
    plans = job.replans + 1
    with TableCatalog.open(job.catalog) as catalog:
        for plan in range(1, plans + 1):
            files = live_files(catalog, job.collection)
            of = shard_of_files(catalog, files, shards, cache)
            mine = [f for f in files.files if of[f.path] == job.shard]
            chosen = candidates(mine, job.selection, job.policy)
            bins = plan_bins(chosen, job.policy.target_file_bytes)
            if not bins:
                return CompactionResult(
                    job.collection,
                    job.shard,
                    Outcome.NOTHING_TO_DO,
                    plans=plan,
                    reason=f"fewer than 2 candidate files among the {len(mine)} of the shard",
                )
            result = _attempt(
                spark,
                catalog,
                job,
                plan=plan,
                primary_key=files.primary_key,
                bins=bins,
                group=group,
            )
            if isinstance(result, CompactionResult):
                recorded = time.monotonic()
                _after_commit(catalog, job, shards, cache)
                log.info(
                    "compact %s-%d: %.1fs in all, recording the shard %.1fs",
                    job.collection,
                    job.shard,
                    time.monotonic() - started,
                    time.monotonic() - recorded,
                )
                return result
            reason = result
            log.info("compact %s-%d: %s; planning again", job.collection, job.shard, reason)
    return CompactionResult(
        job.collection,
        job.shard,
        Outcome.GAVE_UP,
        plans=plans,
        reason=f"the inputs changed before each of {plans} commits (last: {reason})",
    )


def _attempt(
    spark: SparkSession,
    catalog: TableCatalog,
    job: CompactJob,
    *,
    plan: int,
    primary_key: str,
    bins: Sequence[Bin],
    group: str,
) -> CompactionResult | str:
    """Write the bins and commit them; the result, or why the inputs changed."""
    tasks = [
        BinTask(job, plan, i, primary_key, tuple(f.path for f in b.inputs))
        for i, b in enumerate(bins)
    ]
    context = spark.sparkContext
    if group:
        context.setJobGroup(group, f"compact {job.collection}-{job.shard}", True)
    started = time.monotonic()
    outputs = context.parallelize(tasks, len(tasks)).map(compact_bin).collect()
    written = time.monotonic()
    failures = [o for o in outputs if isinstance(o, BinFailure)]
    if failures:
        raise failures[0].error()
    results = sorted((o for o in outputs if isinstance(o, BinResult)), key=lambda r: r.index)
    for b, result in zip(bins, results, strict=True):
        if result.rows != b.rows:
            raise errors.CorruptData(
                f"bin {result.index} of {job.collection}-{job.shard}: read {result.rows} "
                f"rows from files whose manifests count {b.rows}"
            )
    inputs = [f.path for b in bins for f in b.inputs]
    properties = {
        "headrace.compaction-shard": str(job.shard),
        "headrace.compaction-run": job.run_id,
    }
    outputs_paths = [r.path for r in results]
    replaced = replace_files(catalog, job.collection, inputs, outputs_paths, properties)
    log.info(
        "compact %s-%d plan %d: %d bins, tasks %.1fs (slowest %.1fs), commit %.1fs: %s",
        job.collection,
        job.shard,
        plan,
        len(bins),
        written - started,
        max(r.seconds for r in results),
        time.monotonic() - written,
        replaced.outcome.value,
    )
    if replaced.outcome is not ReplaceOutcome.COMMITTED:
        return replaced.reason
    return CompactionResult(
        job.collection,
        job.shard,
        Outcome.COMMITTED,
        inputs=len(inputs),
        outputs=len(results),
        rows=sum(r.rows for r in results),
        snapshot_id=replaced.snapshot_id,
        plans=plan,
        commit_attempts=replaced.attempts,
        metadata_location=replaced.metadata_location,
    )


def _after_commit(
    catalog: TableCatalog, job: CompactJob, shards: int, cache: dict[str, int]
) -> None:
    """Record the shard's ShardCompaction (the delete-ratio trigger's baseline)."""
    table = catalog.iceberg_table(job.collection)
    files = files_of(catalog, table, job.collection)
    of = shard_of_files(catalog, files, shards, cache)
    live = sum(f.rows for f in files.files if of[f.path] == job.shard)
    _, flushed = asyncio.run(_shard_facts(job))
    snapshot = table.current_snapshot()
    record = ShardCompaction(
        collection=job.collection,
        shard=job.shard,
        at=time.time(),
        snapshot_id=0 if snapshot is None else snapshot.snapshot_id,
        deleted=max(flushed - live, 0),
        live_rows=live,
    )
    asyncio.run(_record(job, record))


# -- command line ---------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> tuple[CompactJob, str]:
    parser = argparse.ArgumentParser(
        prog="python -m spark_apps.compact", description=__doc__.split("\n")[0]
    )
    defaults = CompactionPolicy()
    parser.add_argument("--metastore", required=True)
    parser.add_argument("--cluster", default="default")
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--collection", required=True)
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--selection", choices=["small", "all"], default="small")
    parser.add_argument("--target-file-bytes", type=int, default=defaults.target_file_bytes)
    parser.add_argument("--small-file-bytes", type=int, default=defaults.small_file_bytes)
    parser.add_argument("--max-input-files", type=int, default=defaults.max_input_files)
    parser.add_argument("--replans", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--s3-endpoint", default=os.environ.get("HEADRACE_S3_ENDPOINT", ""))
    args = parser.parse_args(argv)
    if args.shard < 0 or args.replans < 0:
        parser.error("--shard and --replans must be >= 0")
    try:
        policy = CompactionPolicy(
            target_file_bytes=args.target_file_bytes,
            small_file_bytes=args.small_file_bytes,
            max_input_files=args.max_input_files,
        )
    except errors.InvalidArgument as exc:
        parser.error(str(exc))
    store = ObjectStoreOptions.from_env(args.s3_endpoint)
    job = CompactJob(
        catalog=CatalogConfig(args.metastore, args.warehouse, args.cluster, store),
        collection=args.collection,
        shard=args.shard,
        run_id=uuid.uuid4().hex[:12],
        selection=Selection(args.selection.upper()),
        policy=policy,
        replans=args.replans,
    )
    return job, args.master


def _warm(_: int) -> bool:
    """Runs in a Python worker: import what a compaction task imports."""
    import headrace.table.catalog  # noqa: PLC0415, F401 - the import is the point

    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Run one compaction; the summary JSON carries ``startup_s`` (new session
    and warm workers) and ``compact_s`` (the job in that session) apart."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    job, master = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    spark = spark_session(master)
    try:
        workers = spark.sparkContext.defaultParallelism
        spark.sparkContext.parallelize(range(workers), workers).map(_warm).collect()
        ready = time.monotonic()
        result = run_in(spark, job)
        done = time.monotonic()
    except errors.HeadraceError as exc:
        print(f"compaction of {job.collection}-{job.shard} failed: {exc}", file=sys.stderr)
        return EXIT_CODES.get(exc.code, 1)
    finally:
        spark.stop()
    summary = result.summary()
    summary.update(startup_s=round(ready - started, 3), compact_s=round(done - ready, 3))
    print(json.dumps(summary))
    if result.outcome is Outcome.GAVE_UP:
        print(
            f"compaction of {job.collection}-{job.shard} gave up: {result.reason}", file=sys.stderr
        )
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
