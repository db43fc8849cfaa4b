"""DuckDB as an independent reader of the tables: no Headrace or pyiceberg code.

The avro, iceberg and httpfs extensions come from PyPI wheels
(``duckdb-ext-*``) and are loaded by path, so nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import duckdb

from tests.fixtures_s3 import S3Store

EXTENSIONS = ("avro", "iceberg", "httpfs")


def extension_dir() -> Path:
    spec = importlib.util.find_spec("duckdb_ext")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the duckdb-ext-* wheels are not installed (dev dependencies)")
    root = Path(next(iter(spec.submodule_search_locations)))
    return root / "extensions" / f"v{duckdb.__version__}" / "linux_amd64"


def connect(s3: S3Store | None = None) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(
        config={"allow_unsigned_extensions": True, "autoinstall_known_extensions": False}
    )
    for name in EXTENSIONS:
        con.execute(f"LOAD '{extension_dir() / f'{name}.duckdb_extension'}'")
    if s3 is not None:
        host = s3.endpoint.removeprefix("http://")
        con.execute(
            "CREATE SECRET headrace_s3 (TYPE s3, KEY_ID ?, SECRET ?, ENDPOINT ?, "
            "URL_STYLE 'path', USE_SSL false, REGION 'us-east-1')",
            [s3.access_key, s3.secret_key, host],
        )
    return con


def iceberg_rows(metadata_location: str, s3: S3Store | None = None) -> list[tuple[Any, ...]]:
    """Every row of the table at ``metadata_location``, sorted."""
    con = connect(s3)
    try:
        location = metadata_location.removeprefix("file://")
        rows = con.execute("SELECT * FROM iceberg_scan(?)", [location]).fetchall()
    finally:
        con.close()
    return sorted(rows)
