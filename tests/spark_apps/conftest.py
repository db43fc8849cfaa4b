"""The Spark session the spark_apps tests share (one JVM per test session)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from spark_apps.flush import spark_session  # noqa: PLC0415 - starts a JVM

    session = spark_session("local[2]")
    yield session
    session.stop()
