"""Open a metastore from its URL.

* ``sqlite:///abs/path/meta.db``: an SQLite file, created if missing (with its
  directory) when the opener creates (a standalone, a node); a client opens
  with ``create=False`` and gets NotFound for a missing file instead.
  Everything after ``sqlite://`` is the path, so
  ``sqlite://data/meta.db`` is relative to the working directory.
* ``etcd://host:port[,host:port...]``: an etcd cluster (port defaults to 2379).

Opening checks that the store works: an unreachable etcd or an SQLite path that
cannot be created or written raises :class:`headrace.errors.Unavailable`
within ``connect_timeout`` seconds (a few seconds by default).
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from headrace import errors
from headrace.metastore.contract import Metastore
from headrace.metastore.etcd import EtcdMetastore
from headrace.metastore.etcd_wire import Endpoint, parse_endpoints
from headrace.metastore.sqlite import SqliteMetastore

SCHEMES = ("sqlite", "etcd")


@dataclasses.dataclass(frozen=True, slots=True)
class MetastoreURL:
    scheme: str
    path: str = ""
    """SQLite: the database file."""
    endpoints: tuple[Endpoint, ...] = ()
    """etcd: the endpoints, in order."""


def parse_url(url: str) -> MetastoreURL:
    """Split and validate a metastore URL (pure; see the module docstring)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise errors.InvalidArgument(
            f"metastore URL {errors.quoted(url)}: expected sqlite:///path/to/file.db or etcd://host:port"
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
            f"metastore URL {errors.quoted(url)}: expected etcd://host:port[,...]"
        )
    return MetastoreURL("etcd", endpoints=tuple(parse_endpoints(rest.rstrip("/"))))


async def open_metastore(
    url: str, *, connect_timeout: float = 3.0, create: bool = True
) -> Metastore:
    """The metastore at ``url``, checked to answer; close it when done.

    ``create=False`` (clients): never create anything; a missing SQLite file
    raises :class:`headrace.errors.NotFound` at once.
    """
    parsed = parse_url(url)
    if parsed.scheme == "etcd":
        return await EtcdMetastore.connect(parsed.endpoints, connect_timeout=connect_timeout)
    path = str(Path(parsed.path))
    try:
        async with asyncio.timeout(connect_timeout * 2):
            return await SqliteMetastore.open(path, busy_timeout=connect_timeout, create=create)
    except TimeoutError:
        raise errors.Unavailable(
            f"SQLite metastore {path} did not open within {connect_timeout * 2:.0f} s"
        ) from None
