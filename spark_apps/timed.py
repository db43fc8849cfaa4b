"""The flush job with its start-up and its work timed apart (for ``headrace
bench flush``): the same arguments as ``python -m spark_apps.flush``; prints
one JSON line ``{"startup_s", "flush_s", "outcome", "checkpoint"}``.

``startup_s``: new session (JVM, Spark context) until ready, plus one trivial
job that starts the Python workers and imports the task's modules there;
``flush_s``: the job itself in that warm session (read the range, write
Parquet, commit), which is what the standalone's long-lived runner pays per
flush after its first.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence

from headrace import errors
from spark_apps.flush import parse_args, run_in, spark_session
from spark_apps.schedule import EXIT_CODES


def _warm(_: int) -> bool:
    """Runs in a Python worker: import what a flush task imports."""
    import spark_apps.shard  # noqa: PLC0415, F401 - the import is the point

    return True


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    job, master = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    spark = spark_session(master)
    workers = spark.sparkContext.defaultParallelism
    spark.sparkContext.parallelize(range(workers), workers).map(_warm).collect()
    ready = time.monotonic()
    try:
        result = run_in(spark, job)
    except errors.HeadraceError as exc:
        print(f"flush failed: {exc}", file=sys.stderr)
        return EXIT_CODES.get(exc.code, 1)
    finally:
        done = time.monotonic()
        spark.stop()
    print(
        json.dumps(
            {
                "startup_s": round(ready - started, 3),
                "flush_s": round(done - ready, 3),
                "outcome": result.outcome.value,
                "checkpoint": result.checkpoint.position,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
