"""Where a catalog's tables live: a local directory or an S3 prefix.

:class:`Warehouse` turns a warehouse URI plus :class:`ObjectStoreOptions` into
the FileIO properties pyiceberg uses (always pyarrow's own filesystems, no
fsspec) and translates storage failures once, at this boundary:

* the object store does not answer (connection refused, timeouts, DNS):
  :class:`headrace.errors.Unavailable` naming the endpoint (retryable);
* a file the commit names does not exist: :class:`headrace.errors.InvalidArgument`;
  a file committed metadata references (:class:`Referenced`: a snapshot's
  manifest list, manifests, data files) does not exist:
  :class:`headrace.errors.MissingFile` naming the file and what references it
  (lost data, or a snapshot expired under a reader that did not pin it: not
  the caller's input);
* a full disk: :class:`headrace.errors.StorageFull`.

S3 notes for SeaweedFS (see docs/pipeline.md): nothing is ever fenced on S3
conditional writes (the metastore transaction is the only commit point), and
request checksums are computed only when required
(``AWS_REQUEST_CHECKSUM_CALCULATION=when_required``, set for this process if
unset).
"""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path
from urllib.parse import urlparse

from headrace import errors

PY_IO_IMPL = "pyiceberg.io.pyarrow.PyArrowFileIO"


@dataclasses.dataclass(frozen=True, slots=True)
class ObjectStoreOptions:
    """How to reach an S3-compatible object store."""

    endpoint: str = ""
    """``http(s)://host:port``; empty for AWS itself."""
    access_key: str = ""
    secret_key: str = ""
    region: str = "us-east-1"
    connect_timeout_s: float = 3.0
    request_timeout_s: float = 30.0

    @classmethod
    def from_env(cls, endpoint: str) -> ObjectStoreOptions:
        """``endpoint`` with the keys of ``AWS_ACCESS_KEY_ID`` and
        ``AWS_SECRET_ACCESS_KEY`` (never flags: ``ps`` shows those)."""
        return cls(
            endpoint=endpoint,
            access_key=os.environ.get("AWS_ACCESS_KEY_ID", ""),
            secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Referenced:
    """A file that committed table metadata references, as a read names it
    when the file is missing."""

    path: str
    """The file's URI; "" when the read does not know which file it opens."""
    by: str
    """What references it (``"snapshot 12 of s3://b/t/metadata/…json"``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Warehouse:
    """A warehouse root: ``/abs/dir``, ``file:///abs/dir`` or ``s3://bucket/prefix``."""

    uri: str
    options: ObjectStoreOptions = dataclasses.field(default_factory=ObjectStoreOptions)

    @classmethod
    def parse(cls, uri: str, options: ObjectStoreOptions | None = None) -> Warehouse:
        parsed = urlparse(uri)
        if parsed.scheme in ("", "file"):
            path = Path(parsed.path if parsed.scheme else uri)
            if not path.is_absolute():
                raise errors.InvalidArgument(f"warehouse {uri!r}: a local path must be absolute")
            return cls(f"file://{path}", options or ObjectStoreOptions())
        if parsed.scheme == "s3":
            if not parsed.netloc:
                raise errors.InvalidArgument(f"warehouse {uri!r}: no bucket (s3://bucket/prefix)")
            return cls(uri.rstrip("/"), options or ObjectStoreOptions())
        raise errors.InvalidArgument(
            f"warehouse {uri!r}: expected an absolute directory or s3://bucket/prefix"
        )

    @property
    def is_s3(self) -> bool:
        return self.uri.startswith("s3://")

    @property
    def where(self) -> str:
        """The store, for error messages."""
        if self.is_s3:
            return f"object store {self.options.endpoint or 'AWS S3'} ({self.uri})"
        return f"warehouse directory {self.uri.removeprefix('file://')}"

    def local_root(self) -> Path | None:
        return None if self.is_s3 else Path(self.uri.removeprefix("file://"))

    def io_properties(self) -> dict[str, str]:
        """FileIO properties for pyiceberg."""
        props = {"py-io-impl": PY_IO_IMPL, "warehouse": self.uri}
        if self.is_s3:
            os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
            opts = self.options
            props.update(
                {
                    "s3.region": opts.region,
                    "s3.connect-timeout": str(opts.connect_timeout_s),
                    "s3.request-timeout": str(opts.request_timeout_s),
                }
            )
            if opts.endpoint:
                props["s3.endpoint"] = opts.endpoint
            if opts.access_key:
                props["s3.access-key-id"] = opts.access_key
                props["s3.secret-access-key"] = opts.secret_key
        return props

    def translate(
        self, exc: Exception, doing: str, referenced: Referenced | None = None
    ) -> errors.HeadraceError:
        """A storage exception raised while ``doing`` as a Headrace error;
        ``referenced``: the action reads a file committed metadata references
        (a missing one is then MissingFile, CORRUPT, else the caller named it:
        INVALID_ARGUMENT)."""
        if isinstance(exc, errors.HeadraceError):
            return exc
        if isinstance(exc, FileNotFoundError) and referenced is not None:
            return errors.MissingFile(self._missing(referenced, exc), path=referenced.path)
        if isinstance(exc, FileNotFoundError):
            return errors.InvalidArgument(f"{doing}: {exc} not found in the {self.where}")
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return errors.StorageFull(f"{doing}: the {self.where} is full: {exc}")
        if isinstance(exc, PermissionError):
            return errors.InvalidArgument(f"{doing}: permission denied in the {self.where}: {exc}")
        return errors.Unavailable(f"{doing}: the {self.where} failed: {exc}")

    def _missing(self, referenced: Referenced, exc: FileNotFoundError) -> str:
        what = referenced.path or f"a file ({exc})"
        return (
            f"{referenced.by} needs {what}, which is not in the {self.where}: it was collected "
            f"after the reader read {referenced.by} (snapshot expiry and orphan collection "
            "keep only what retained snapshots need: a reader that held no pin of its "
            "snapshot, or whose pin was lost, reads a newer snapshot when it reads again), or "
            "it was deleted from the store by hand (its rows are lost)"
        )
