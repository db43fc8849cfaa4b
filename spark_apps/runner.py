"""The standalone's flush runner: one long-lived local Spark session that
flushes every pchannel whose last seal is past its checkpoint.

    python -m spark_apps.runner --metastore sqlite:///abs/meta.db --cluster default \\
        --warehouse /abs/warehouse [--master local[2]] [--deadline 600] [--exit-with-parent PID]

It keeps one ``SparkSession`` for its whole life (a new process per flush pays
10-60 s of JVM and session start-up, see docs/pipeline.md), started when the
first flush is due (a standalone whose log holds no collection data runs no
JVM), and loops:

1. read, per pchannel, the last seal (``<root>/seals/<p>``, written by the
   owner node), the checkpoint and the Assignment;
2. decide (:mod:`spark_apps.schedule`, pure) to flush ``(checkpoint, seal]``
   under the Assignment's current term, or to wait and why;
3. run the flush job (:func:`spark_apps.flush.run_in`) in the session, one
   pchannel at a time, under a job group and a deadline: past the deadline the
   group is cancelled (``cancelJobGroup``) and the flush retried later;
4. every ``maintenance_interval_s``, between two flushes (never during one),
   expire old snapshots and delete orphan files of every table
   (:func:`headrace.table.maintenance.maintain_all`, plain pyarrow, no Spark);
5. sleep until a seal or an Assignment changes (metastore watch), a back-off
   ends, or the poll interval passes.

A flush that does not end within ``abandon_grace_s`` after its cancellation
(hung outside Spark) makes the runner exit with status 6: its supervisor
starts a fresh one; the commit's term and checkpoint guards make the
abandoned run harmless.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

from headrace import errors
from headrace.client import HeadraceClient
from headrace.logs import LogFormat, configure
from headrace.metastore.contract import Metastore
from headrace.metastore.factory import open_metastore
from headrace.table import CatalogConfig, FlushResult, ObjectStoreOptions, TableCatalog
from headrace.table.collections import CollectionStore
from headrace.table.expiry import RetentionOptions
from headrace.table.maintenance import MaintenanceFailure, MaintenanceReport, maintain_all
from headrace.table.records import (
    compaction_requests_prefix,
    seals_prefix,
)
from spark_apps import compact
from spark_apps.channels import read_channels
from spark_apps.compact_schedule import CompactionPolicy
from spark_apps.compactor import Compactor, CompactorOptions
from spark_apps.flush import run_in, spark_session
from spark_apps.schedule import (
    Attempts,
    Launch,
    Outcome,
    Result,
    RetryPolicy,
    Wait,
    after,
    is_poison,
    next_step,
)
from spark_apps.shard import RangeJob

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("spark_apps.runner")

EXIT_STUCK = 6

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class RunnerOptions:
    metastore_url: str
    warehouse: str
    cluster: str = "default"
    master: str = "local[2]"
    object_store: ObjectStoreOptions = dataclasses.field(default_factory=ObjectStoreOptions)
    deadline_s: float = 600.0
    """A flush still running after this long is cancelled and retried later."""
    abandon_grace_s: float = 30.0
    """How long a cancelled flush may take to end before the runner exits."""
    poll_s: float = 5.0
    """Longest sleep between two reads of the records (watches wake it sooner)."""
    retry: RetryPolicy = dataclasses.field(default_factory=RetryPolicy)
    rows_per_file: int = 1_000_000
    read_idle_timeout_s: float = 60.0
    parent: int = 0
    """Stop once this process (the standalone) is gone; 0: never."""
    maintenance_interval_s: float = 600.0
    """How often every table's old snapshots are expired and orphan files deleted."""
    retention: RetentionOptions = dataclasses.field(default_factory=RetentionOptions)
    log_format: LogFormat = LogFormat.TEXT
    compaction: CompactorOptions = dataclasses.field(default_factory=CompactorOptions)

    @property
    def catalog(self) -> CatalogConfig:
        return CatalogConfig(self.metastore_url, self.warehouse, self.cluster, self.object_store)


class Stuck(errors.HeadraceError):
    """A cancelled flush did not end: only a new process recovers."""


class FlushRunner:
    def __init__(
        self,
        options: RunnerOptions,
        spark: Callable[[], SparkSession],
        metastore: Metastore,
    ) -> None:
        """``spark`` makes the session, called once, when the first flush is due."""
        self.options = options
        self._make_spark = spark
        self._spark: SparkSession | None = None
        self.startup_s: float | None = None
        """Seconds the session took to start (None until it did)."""
        self.metastore = metastore
        # The public client's view of the cluster: its keys, and (made on
        # construction) the message id classes of every WAL backend, which
        # comparing the seal with the checkpoint needs.
        self.keys = HeadraceClient(options.metastore_url, options.cluster, metastore=metastore).keys
        self.attempts: dict[str, Attempts] = {}
        self._reasons: dict[str, str] = {}
        self._wake = asyncio.Event()
        self.maintenance_due = 0.0
        """``time.monotonic()`` at which the next maintenance round is due."""
        self.maintenance_rounds = 0
        self.compactor = Compactor(options.compaction, options.catalog, metastore, self.keys)

    async def run(self, stop: asyncio.Event) -> None:
        """Flush until ``stop`` is set."""
        watchers = [
            asyncio.create_task(self._watch(seals_prefix(self.keys), stop)),
            asyncio.create_task(self._watch(self.keys.pchannels, stop)),
            asyncio.create_task(self._watch(compaction_requests_prefix(self.keys), stop)),
        ]
        try:
            while not stop.is_set():
                # Cleared before reading: a change during the read wakes the next sleep.
                self._wake.clear()
                steps = await self._steps()
                self._report(steps)
                launches = [s for s in steps if isinstance(s, Launch)]
                for launch in launches:
                    if stop.is_set():
                        break
                    await self._flush(launch, stop)
                if not stop.is_set():
                    await self._maintain()
                compacted = False
                if not stop.is_set():
                    ran = await self.compactor.round(
                        self.session,
                        lambda work, group, what: self.guarded(work, group, what, stop),
                    )
                    compacted = any(r.outcome is compact.Outcome.COMMITTED for r in ran)
                if not launches and not compacted:
                    await self._sleep(steps, stop)
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)

    async def _steps(self) -> list[Launch | Wait]:
        """This round's decisions; none while the metastore does not answer."""
        try:
            channels = await read_channels(self.metastore, self.keys)
        except errors.HeadraceError as exc:
            log.warning("cannot read the flush records (retrying): %s", exc)
            return []
        now = time.monotonic()
        return [next_step(c, self.attempts.get(c.pchannel, Attempts()), now) for c in channels]

    def _report(self, steps: Sequence[Launch | Wait]) -> None:
        """Log each pchannel's reason to wait when it changes."""
        for step in steps:
            if isinstance(step, Wait) and self._reasons.get(step.pchannel) != step.reason:
                self._reasons[step.pchannel] = step.reason
                level = logging.ERROR if step.loud else logging.INFO
                log.log(level, "%s: waiting: %s", step.pchannel, step.reason)

    async def _sleep(self, steps: Sequence[Launch | Wait], stop: asyncio.Event) -> None:
        ends = [s.until for s in steps if isinstance(s, Wait) and s.until is not None]
        ends.extend((self.maintenance_due, self.compactor.due))
        timeout = self.options.poll_s
        if ends:
            timeout = max(0.0, min(timeout, min(ends) - time.monotonic()))
        waits = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waits:
            waiter.cancel()

    async def _watch(self, prefix: str, stop: asyncio.Event) -> None:
        """Wake the loop on every change under ``prefix``; polling covers a
        watch that fails (logged once per failure, retried after the poll)."""
        while not stop.is_set():
            try:
                watch = await self.metastore.watch_prefix(prefix)
                try:
                    async for _ in watch:
                        self._wake.set()
                finally:
                    await watch.close()
            except errors.HeadraceError as exc:
                log.warning("watch of %s failed (polling meanwhile): %s", prefix, exc)
            await asyncio.sleep(self.options.poll_s)

    async def _maintain(self) -> None:
        """Expire snapshots and collect orphan files of every table, if due.

        Runs between flushes in this loop, so never during a flush; a table
        that fails (an object store that does not answer) is logged and
        retried at the next round.
        """
        if time.monotonic() < self.maintenance_due:
            return
        self.maintenance_due = time.monotonic() + self.options.maintenance_interval_s
        try:
            collections = await CollectionStore(self.metastore, self.keys).list()
        except errors.HeadraceError as exc:
            log.warning("maintenance: cannot list the collections (next round): %s", exc)
            return
        dropped = {c.name: c.dropped.at for c in collections if c.dropped is not None}
        results = await asyncio.to_thread(_maintain_tables, self.options, dropped)
        self.maintenance_rounds += 1
        for result in results:
            if isinstance(result, MaintenanceFailure):
                log.warning(
                    "%s: maintenance failed (next round): %s", result.collection, result.error
                )
            elif result.expired or result.deleted:
                log.info(
                    "%s: expired %d snapshots, deleted %d unreferenced files",
                    result.collection,
                    len(result.expired),
                    len(result.deleted),
                )

    def _job(self, launch: Launch) -> RangeJob:
        o = self.options
        return RangeJob(
            cluster=o.cluster,
            metastore_url=o.metastore_url,
            pchannel=launch.pchannel,
            term=launch.term,
            start=launch.start,
            end=launch.end,
            catalog=o.catalog,
            attempt=uuid.uuid4().hex[:12],
            rows_per_file=o.rows_per_file,
            read_idle_timeout_s=o.read_idle_timeout_s,
        )

    async def _flush(self, launch: Launch, stop: asyncio.Event) -> None:
        log.info(
            "%s: flushing (%s, %s] under term %d",
            launch.pchannel,
            launch.start or "beginning",
            launch.end,
            launch.term,
        )
        started = time.monotonic()
        result = await self.flush(launch, stop)
        self._reasons.pop(launch.pchannel, None)
        history = after(
            self.attempts.get(launch.pchannel, Attempts()),
            result,
            time.monotonic(),
            self.options.retry,
        )
        self.attempts[launch.pchannel] = history
        took = time.monotonic() - started
        if result.outcome is Outcome.COMMITTED:
            log.info("%s: flushed to %s in %.1fs", launch.pchannel, launch.end, took)
        elif is_poison(result):
            log.error(
                "%s: FLUSH REFUSED, bad data in (%s, %s]: %s; retrying in %.0fs",
                launch.pchannel,
                launch.start or "beginning",
                launch.end,
                history.last_error,
                history.retry_at - time.monotonic(),
            )
        else:
            log.warning(
                "%s: flush %s after %.1fs: %s; retrying in %.1fs",
                launch.pchannel,
                result.outcome.value,
                took,
                history.last_error,
                max(0.0, history.retry_at - time.monotonic()),
            )

    @property
    def started(self) -> SparkSession | None:
        """The session if it was started."""
        return self._spark

    async def session(self) -> SparkSession:
        """The runner's one Spark session, started on first use."""
        if self._spark is None:
            started = time.monotonic()
            try:
                self._spark = await asyncio.to_thread(self._make_spark)
            except Exception as exc:  # pyspark and py4j raise their own types (no JVM, bad master)
                raise errors.Unavailable(
                    f"the Spark session did not start: {_first_line(exc)}"
                ) from exc
            self.startup_s = time.monotonic() - started
            log.info("Spark session ready in %.1fs (startup_s)", self.startup_s)
        return self._spark

    async def flush(self, launch: Launch, stop: asyncio.Event) -> Result:
        """One flush in the session, cancelled past the deadline or on stop."""
        try:
            spark = await self.session()
        except errors.Unavailable as exc:
            return Result(launch, Outcome.FAILED, exc)
        job = self._job(launch)
        ran = await self.guarded(
            functools.partial(run_in, spark, job),
            f"headrace-flush-{launch.pchannel}-{uuid.uuid4().hex[:8]}",
            f"the flush of ({launch.start or 'beginning'}, {launch.end}] of {launch.pchannel}",
            stop,
        )
        result = outcome_of(launch, ran.future)
        if ran.cancelled and result.outcome is not Outcome.COMMITTED:
            return Result(launch, Outcome.TIMED_OUT)
        return result

    async def guarded(
        self, work: Callable[[str], T], group: str, what: str, stop: asyncio.Event
    ) -> Ran[T]:
        """``work(group)`` in a worker thread, its Spark jobs in ``group``; past
        the deadline (or on stop) the group is cancelled; Stuck if it does not
        end ``abandon_grace_s`` after that."""
        future = asyncio.ensure_future(asyncio.to_thread(work, group))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait(
            {future, stopped}, timeout=self.options.deadline_s, return_when=asyncio.FIRST_COMPLETED
        )
        stopped.cancel()
        if future.done():
            return Ran(future, cancelled=False)
        assert self._spark is not None
        self._spark.sparkContext.cancelJobGroup(group)
        await asyncio.wait({future}, timeout=self.options.abandon_grace_s)
        if not future.done():
            raise Stuck(
                f"{what} did not end {self.options.abandon_grace_s:.0f}s after its cancellation"
            )
        return Ran(future, cancelled=True)


@dataclasses.dataclass(frozen=True, slots=True)
class Ran(Generic[T]):
    """A finished piece of work run under the deadline."""

    future: asyncio.Future[T]
    cancelled: bool
    """It passed its deadline (or the runner stopped) and was cancelled."""


def _maintain_tables(
    options: RunnerOptions, dropped: dict[str, float]
) -> list[MaintenanceReport | MaintenanceFailure]:
    try:
        catalog = TableCatalog.open(options.catalog)
    except errors.HeadraceError as exc:
        return [MaintenanceFailure("(every table)", exc)]
    with catalog:
        # Each table's expiry reads its reader pins itself, guarded by the pin epoch.
        return maintain_all(catalog, dropped, options.retention)


def outcome_of(launch: Launch, job: asyncio.Future[FlushResult]) -> Result:
    """The Result of a finished flush; an error that is not Headrace's (Spark's
    own, e.g. a cancelled job or a dead worker) is retryable UNAVAILABLE."""
    exc = job.exception()
    if exc is None:
        return Result(launch, Outcome.COMMITTED)
    if isinstance(exc, errors.HeadraceError):
        return Result(launch, Outcome.FAILED, exc)
    return Result(
        launch, Outcome.FAILED, errors.Unavailable(f"the Spark job failed: {_first_line(exc)}")
    )


def _first_line(exc: BaseException) -> str:
    """A foreign exception in one line (a JVM error's text is a stack trace)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


async def _stop_when_orphaned(stop: asyncio.Event, parent: int) -> None:
    while not stop.is_set():
        if os.getppid() != parent:
            log.warning("parent process %d is gone; stopping", parent)
            stop.set()
            return
        await asyncio.sleep(0.5)


async def serve(options: RunnerOptions, stop: asyncio.Event) -> None:
    """Run the runner until ``stop``; stop its Spark session (if it started)."""
    metastore = await open_metastore(options.metastore_url, create=False)
    watcher = (
        asyncio.create_task(_stop_when_orphaned(stop, options.parent)) if options.parent else None
    )
    runner = FlushRunner(options, lambda: spark_session(options.master), metastore)
    try:
        await runner.run(stop)
        # Only after a clean run: with a flush stuck in the session, stopping
        # it could hang too; the JVM goes with this process anyway.
        if runner.started is not None:
            await asyncio.to_thread(runner.started.stop)
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await metastore.close()


def parse_args(argv: Sequence[str]) -> RunnerOptions:
    parser = argparse.ArgumentParser(
        prog="python -m spark_apps.runner", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--metastore", required=True)
    parser.add_argument("--cluster", default="default")
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds per flush")
    parser.add_argument("--poll", type=float, default=5.0)
    parser.add_argument("--rows-per-file", type=int, default=1_000_000)
    parser.add_argument("--read-idle-timeout", type=float, default=60.0)
    parser.add_argument("--exit-with-parent", type=int, default=0, metavar="PID")
    parser.add_argument("--s3-endpoint", default=os.environ.get("HEADRACE_S3_ENDPOINT", ""))
    parser.add_argument(
        "--maintenance-interval", type=float, default=600.0, help="seconds between rounds"
    )
    parser.add_argument("--max-snapshot-age", type=float, default=86_400.0, help="seconds")
    parser.add_argument("--min-snapshots", type=int, default=5)
    parser.add_argument("--orphan-grace", type=float, default=3_600.0, help="seconds")
    parser.add_argument("--log-format", type=LogFormat, choices=list(LogFormat), default="text")
    policy = CompactionPolicy()
    parser.add_argument(
        "--compaction-interval", type=float, default=60.0, help="seconds between rounds"
    )
    parser.add_argument("--target-file-bytes", type=int, default=policy.target_file_bytes)
    parser.add_argument("--small-file-bytes", type=int, default=policy.small_file_bytes)
    parser.add_argument("--min-small-files", type=int, default=policy.min_small_files)
    parser.add_argument("--max-delete-ratio", type=float, default=policy.max_delete_ratio)
    parser.add_argument(
        "--max-small-file-age", type=float, default=policy.max_small_file_age_s, help="seconds"
    )
    parser.add_argument("--max-input-files", type=int, default=policy.max_input_files)
    args = parser.parse_args(argv)
    positive = (
        "deadline",
        "poll",
        "rows_per_file",
        "read_idle_timeout",
        "maintenance_interval",
        "compaction_interval",
    )
    for name in positive:
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    try:
        retention = RetentionOptions(
            max_snapshot_age_s=args.max_snapshot_age,
            min_snapshots=args.min_snapshots,
            orphan_grace_s=args.orphan_grace,
        )
        policy = CompactionPolicy(
            target_file_bytes=args.target_file_bytes,
            small_file_bytes=args.small_file_bytes,
            min_small_files=args.min_small_files,
            max_delete_ratio=args.max_delete_ratio,
            max_small_file_age_s=args.max_small_file_age,
            max_input_files=args.max_input_files,
        )
    except errors.InvalidArgument as exc:
        parser.error(str(exc))
    return RunnerOptions(
        metastore_url=args.metastore,
        warehouse=args.warehouse,
        cluster=args.cluster,
        master=args.master,
        object_store=ObjectStoreOptions.from_env(args.s3_endpoint),
        deadline_s=args.deadline,
        poll_s=args.poll,
        rows_per_file=args.rows_per_file,
        read_idle_timeout_s=args.read_idle_timeout,
        parent=args.exit_with_parent,
        maintenance_interval_s=args.maintenance_interval,
        retention=retention,
        log_format=args.log_format,
        compaction=CompactorOptions(interval_s=args.compaction_interval, policy=policy),
    )


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    configure(logging.INFO, options.log_format)

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(f"headrace flush runner ready master={options.master}", flush=True)
        await serve(options, stop)

    try:
        asyncio.run(go())
    except Stuck as exc:
        log.error("%s; exiting so that a fresh runner takes over", exc)
        logging.shutdown()
        os._exit(EXIT_STUCK)  # the hung thread would block a normal interpreter exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
