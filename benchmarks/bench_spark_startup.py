"""Spark local-mode start-up: a new process per flush vs one long-lived session.

    python benchmarks/bench_spark_startup.py [--jobs 5] [--master local[2]]

Prints one JSON line: seconds from process start to a ready ``SparkSession``
(``session_s``), the first trivial two-partition job in it (``first_job_s``)
and each later one (``later_jobs_s``). A process per flush pays
``session_s + first_job_s`` each time; a long-lived session pays a later job's
time. Figures of this machine: docs/pipeline.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

STARTED = time.monotonic()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # noqa: PLC0415 - its import is part of the start-up

    spark = (
        SparkSession.builder.master(args.master)
        .appName("headrace-startup")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    ready = time.monotonic()
    jobs = []
    for _ in range(args.jobs):
        started = time.monotonic()
        spark.sparkContext.parallelize(range(2), 2).map(lambda x: x * 2).collect()
        jobs.append(round(time.monotonic() - started, 2))
    spark.stop()
    print(
        json.dumps(
            {
                "session_s": round(ready - STARTED, 2),
                "first_job_s": jobs[0],
                "later_jobs_s": jobs[1:],
                "load_average": os.getloadavg()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
