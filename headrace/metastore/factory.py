"""Open a metastore from its URL.

* ``sqlite:///abs/path/meta.db``: an SQLite file, created if missing (with its
  directory) when the opener creates (a standalone, a node); a client opens
  with ``create=False`` and gets NotFound for a missing file instead.
  Everything after ``sqlite://`` is the path, so
  ``sqlite://data/meta.db`` is relative to the working directory.
* ``etcd://host:port[,host:port...]``: an etcd cluster (port defaults to 2379);
  ``etcds://`` speaks TLS to it. Certificates and the user come from the
  environment (:mod:`headrace.metastore.etcd_security`), never from the URL.

Opening checks that the store works: an unreachable etcd or an SQLite path that
cannot be created or written raises :class:`headrace.errors.Unavailable`
within ``connect_timeout`` seconds (a few seconds by default).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

from headrace import errors
from headrace.metastore.contract import Metastore
from headrace.metastore.etcd import EtcdMetastore
from headrace.metastore.etcd_security import EtcdSecurity
from headrace.metastore.etcd_wire import Endpoint, parse_endpoints
from headrace.metastore.sqlite import SqliteMetastore

SCHEMES = ("sqlite", "etcd", "etcds")


@dataclasses.dataclass(frozen=True, slots=True)
class MetastoreURL:
    scheme: str
    path: str = ""
    """SQLite: the database file."""
    endpoints: tuple[Endpoint, ...] = ()
    """etcd: the endpoints, in order."""
    tls: bool = False
    """etcd: speak TLS (``etcds://``)."""


def parse_url(url: str) -> MetastoreURL:
    """Split and validate a metastore URL (pure; see the module docstring)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise errors.InvalidArgument(
            f"metastore URL {errors.quoted(url)}: expected sqlite:///path/to/file.db, "
            "etcd://host:port or etcds://host:port"
        )
    if "?" in rest or "#" in rest:
        raise errors.InvalidArgument(
            f"metastore URL {errors.quoted(url)}: no query or fragment allowed"
        )
    if scheme == "sqlite":
        if not rest or rest.endswith("/") or rest == ":memory:":
            raise errors.InvalidArgument(
                f"metastore URL {errors.quoted(url)}: needs a database file path (sqlite:///abs/file.db)"
            )
        return MetastoreURL("sqlite", path=rest)
    if not rest or "/" in rest.rstrip("/"):
        raise errors.InvalidArgument(
            f"metastore URL {errors.quoted(url)}: expected {scheme}://host:port[,...]"
        )
    endpoints = tuple(parse_endpoints(rest.rstrip("/")))
    return MetastoreURL("etcd", endpoints=endpoints, tls=scheme == "etcds")


async def open_metastore(
    url: str,
    *,
    connect_timeout: float = 3.0,
    create: bool = True,
    etcd_security: EtcdSecurity | None = None,
) -> Metastore:
    """The metastore at ``url``, checked to answer; close it when done.

    ``create=False`` (clients): never create anything; a missing SQLite file
    raises :class:`headrace.errors.NotFound` at once. ``etcd_security``: TLS
    files and user for etcd, by default from the environment
    (:meth:`EtcdSecurity.from_env`); its ``tls`` must match the URL's scheme.
    """
    parsed = parse_url(url)
    if parsed.scheme == "etcd":
        security = etcd_security or EtcdSecurity.from_env(os.environ, tls=parsed.tls)
        if security.tls != parsed.tls:
            raise errors.InvalidArgument(
                f"metastore URL {errors.quoted(url)} and its etcd security settings "
                f"disagree on TLS (settings say tls={security.tls})"
            )
        return await EtcdMetastore.connect(
            parsed.endpoints, connect_timeout=connect_timeout, security=security.checked()
        )
    path = str(Path(parsed.path))
    try:
        async with asyncio.timeout(connect_timeout * 2):
            return await SqliteMetastore.open(path, busy_timeout=connect_timeout, create=create)
    except TimeoutError:
        raise errors.Unavailable(
            f"SQLite metastore {path} did not open within {connect_timeout * 2:.0f} s"
        ) from None
