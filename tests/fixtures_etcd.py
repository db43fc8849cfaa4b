"""pytest plugin: one real etcd server per test session.

The server is built and started by the project's test bed
(``scripts/headrace_testbed/etcd.py``) on free loopback ports, with its data in
the session's temporary directory. Set ``HEADRACE_ETCD_ENDPOINT=host:port`` to
use an etcd that is already running instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from headrace_testbed.etcd import EtcdServer, start_etcd
from tests.testbed_start import start_or_fail


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """A single-member etcd started for this session (stopped at its end)."""
    data_dir = tmp_path_factory.mktemp("etcd")
    with start_or_fail("start the etcd test server", lambda: start_etcd(data_dir)) as server:
        yield server


@pytest.fixture(scope="session")
def etcd_endpoint(request: pytest.FixtureRequest) -> str:
    """``host:port`` of a real etcd (the session server unless overridden)."""
    external = os.environ.get("HEADRACE_ETCD_ENDPOINT")
    if external:
        return external
    server: EtcdServer = request.getfixturevalue("etcd_server")
    return server.endpoint


@pytest.fixture(scope="session")
def etcd_url(etcd_endpoint: str) -> str:
    """The metastore URL of :func:`etcd_endpoint`."""
    return f"etcd://{etcd_endpoint}"
