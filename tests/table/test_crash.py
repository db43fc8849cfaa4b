"""A flush job SIGKILLed after writing its data files, after writing the
tables' new metadata files, or right after its commit, then run again: the
table holds each row exactly once."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from headrace.table import Outcome

from .conftest import SCHEMA, Bed, expected
from .flush_child import PKS, config_to_json, the_flush

ROOT = Path(__file__).resolve().parents[2]


def run_child(bed: Bed, point: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tests.table.flush_child", config_to_json(bed.config), point],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]


@pytest.mark.parametrize(
    ("point", "outcome"),
    [
        ("after-files", Outcome.COMMITTED),
        ("before-txn", Outcome.COMMITTED),
        ("after-commit", Outcome.ALREADY_COMMITTED),
    ],
)
def test_flush_retried_after_a_crash_is_not_duplicated(
    bed: Bed, point: str, outcome: Outcome
) -> None:
    bed.assign("pchannel-000", term=3)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
    with bed.open() as catalog:
        before = catalog.table("orders").metadata_location
    run_child(bed, point)
    with bed.open() as catalog:
        if point != "after-commit":
            assert catalog.table("orders").metadata_location == before
            assert bed.get(bed.keys.checkpoint("pchannel-000")) is None
        retried = catalog.commit_flush(the_flush(catalog))
        assert retried.outcome is outcome
        assert retried.checkpoint.position == "local:10"
        location = catalog.table("orders").metadata_location
    assert bed.duckdb_rows(location) == expected(PKS)


def test_rerun_with_new_file_names_after_a_commit_adds_nothing(bed: Bed) -> None:
    """A re-run job that names its files differently still commits nothing twice:
    idempotence is keyed by the WAL range and checkpoint, not by file names."""
    bed.assign("pchannel-000", term=3)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
    run_child(bed, "after-commit")
    with bed.open() as catalog:
        rerun = catalog.commit_flush(the_flush(catalog, name="rerun-with-another-name"))
        assert rerun.outcome is Outcome.ALREADY_COMMITTED
        location = catalog.table("orders").metadata_location
    assert bed.duckdb_rows(location) == expected(PKS)
