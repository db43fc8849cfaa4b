"""pytest plugin: one real etcd server per test session.

The server is built and started by the project's test bed
(``scripts/headrace_testbed/etcd.py``) on free loopback ports, with its data in
the session's temporary directory. Set ``HEADRACE_ETCD_ENDPOINT=host:port`` to
use an etcd that is already running instead.

``etcd_secure_server`` is a second one with TLS, client certificates required
and authentication on (``start_etcd(..., secure=True)``);
``etcd_secure_settings`` are the settings of a client allowed to write.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from headrace.metastore.etcd_security import EtcdSecurity
from headrace_testbed.etcd import EtcdServer, start_etcd
from headrace_testbed.etcd_auth import WRITER
from headrace_testbed.pki import ETCD_CLIENT
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


@pytest.fixture(scope="session")
def etcd_secure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """A single-member etcd with TLS, client certificates and authentication on."""
    data_dir = tmp_path_factory.mktemp("etcd-secure")
    starting = lambda: start_etcd(data_dir, secure=True)  # noqa: E731
    with start_or_fail("start the secure etcd test server", starting) as server:
        yield server


def secure_settings(
    server: EtcdServer, *, user: str = WRITER, cert: str = ETCD_CLIENT
) -> EtcdSecurity:
    """Settings for ``server`` (secure mode) as ``user``, presenting identity ``cert``."""
    assert server.auth is not None, "the server was not started with secure=True"
    pki = server.auth.pki
    return EtcdSecurity(
        tls=True,
        ca_file=str(pki.ca_cert),
        cert_file=str(pki.cert(cert)),
        key_file=str(pki.key(cert)),
        user=user,
        password_file=str(server.auth.password_file(user)),
    )


@pytest.fixture(scope="session")
def etcd_secure_settings(etcd_secure_server: EtcdServer) -> EtcdSecurity:
    """A writer's settings for :func:`etcd_secure_server`."""
    return secure_settings(etcd_secure_server)
