"""Headrace's own error hierarchy.

Every error carries a machine-readable :class:`ErrorCode` and says whether the
caller may retry the same request (possibly after waiting for the channel to be
ready again).  Errors of libraries (sqlite3, aetcd, grpc, confluent-kafka,
pulsar) are translated into these at the module boundary that calls them, so
callers never catch a third-party exception type.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    """Machine-readable error codes; the wire values of the gRPC API."""

    NOT_OWNER = "NOT_OWNER"
    FENCED = "FENCED"
    UNAVAILABLE = "UNAVAILABLE"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    TOO_LARGE = "TOO_LARGE"
    TRUNCATED = "TRUNCATED"
    CORRUPT = "CORRUPT"
    NOT_FOUND = "NOT_FOUND"
    CONFLICT = "CONFLICT"
    IN_USE = "IN_USE"
    STORAGE_FULL = "STORAGE_FULL"
    CLOSED = "CLOSED"
    TXN_ABORTED = "TXN_ABORTED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    FLUSH_BEHIND = "FLUSH_BEHIND"
    WRITES_STOPPED = "WRITES_STOPPED"
    INTERNAL = "INTERNAL"


class HeadraceError(Exception):
    """Base of all Headrace errors."""

    code: ErrorCode = ErrorCode.INTERNAL
    retryable: bool = False

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retryable is not None:
            self.retryable = retryable

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"


class InvalidArgument(HeadraceError):
    """The request itself is wrong; retrying it unchanged cannot succeed."""

    code = ErrorCode.INVALID_ARGUMENT


class MessageTooLarge(InvalidArgument):
    """A message exceeds the configured maximum size; nothing was written."""

    code = ErrorCode.TOO_LARGE


class CorruptData(HeadraceError):
    """Stored or received bytes fail their checksum or cannot be decoded.

    ``path`` and ``offset`` locate the damage when it is in a file (empty and
    -1 otherwise).
    """

    code = ErrorCode.CORRUPT

    def __init__(self, message: str, *, path: str = "", offset: int = -1) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset


class MissingFile(CorruptData):
    """A file that committed table metadata references (a metadata file, a
    manifest list, a manifest, a data file) is not in the store: collected
    after a reader that held no pin of its snapshot read the metadata, or
    deleted by hand. ``path`` names it ("" when the reader could not tell
    which file); the message names what references it."""


class NotOwner(HeadraceError):
    """This node does not (or no longer) serve the pchannel.

    ``owner`` and ``term`` name the owner this node knows of, when it knows.
    The client should rediscover the owner, wait for ready and retry.
    """

    code = ErrorCode.NOT_OWNER
    retryable = True

    def __init__(self, message: str, *, owner: str = "", term: int = 0) -> None:
        super().__init__(message)
        self.owner = owner
        self.term = term


class Fenced(HeadraceError):
    """A writer with an older term tried to act after a newer term took over.

    Retrying with the same term can never succeed; a client that only routed to
    a stale owner retries after rediscovery (hence ``retryable`` for clients).
    """

    code = ErrorCode.FENCED
    retryable = True

    def __init__(self, message: str, *, term: int = 0, current_term: int = 0) -> None:
        super().__init__(message)
        self.term = term
        self.current_term = current_term


class Unavailable(HeadraceError):
    """A dependency (metastore, broker, disk, peer node) does not answer now."""

    code = ErrorCode.UNAVAILABLE
    retryable = True


class StorageFull(Unavailable):
    """The storage refused a write for lack of space; acknowledged data is intact."""

    code = ErrorCode.STORAGE_FULL


class Truncated(InvalidArgument):
    """A read asked for a position that was truncated away."""

    code = ErrorCode.TRUNCATED

    def __init__(self, message: str, *, earliest: str = "") -> None:
        super().__init__(message)
        self.earliest = earliest


class FlushBehind(Unavailable):
    """A pchannel holds more unflushed collection data than its hard watermark:
    appends of collection data wait for the flush to move the checkpoint.
    Nothing was written; the same append succeeds once the flush catches up."""

    code = ErrorCode.FLUSH_BEHIND


class WritesStopped(Unavailable):
    """Writes are stopped cluster-wide (an upgrade with downtime is under way):
    nothing was written; the same append succeeds once writes resume."""

    code = ErrorCode.WRITES_STOPPED


class NotFound(HeadraceError):
    code = ErrorCode.NOT_FOUND


class Conflict(HeadraceError):
    """A compare-and-swap lost: somebody else changed the state first."""

    code = ErrorCode.CONFLICT


class InUse(HeadraceError):
    """Something only one live process may hold (a data directory, a node id)
    is held by another; retrying cannot succeed while that process lives."""

    code = ErrorCode.IN_USE


class Closed(HeadraceError):
    """The object was closed; a new one must be opened."""

    code = ErrorCode.CLOSED
    retryable = True


class TxnAborted(HeadraceError):
    """A transaction was rolled back, expired, or killed by a DDL or a WAL move."""

    code = ErrorCode.TXN_ABORTED


class PermissionDenied(HeadraceError):
    """Credentials were missing, wrong or expired, or lack a permission (a
    rejected certificate or password, a role without the right); retrying
    unchanged cannot succeed. The message names what was refused."""

    code = ErrorCode.PERMISSION_DENIED


QUOTE_LIMIT = 100
"""Characters of a user-given value an error message repeats at most."""


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``value`` as an error message shows it: its repr, a string cut after
    ``limit`` characters with its full size, so a 10 KB name cannot flood the
    message (other values: their repr, cut the same way)."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}… ({len(value.encode(errors='surrogatepass'))} bytes)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


_BY_CODE: dict[ErrorCode, type[HeadraceError]] = {
    ErrorCode.NOT_OWNER: NotOwner,
    ErrorCode.FENCED: Fenced,
    ErrorCode.UNAVAILABLE: Unavailable,
    ErrorCode.INVALID_ARGUMENT: InvalidArgument,
    ErrorCode.TOO_LARGE: MessageTooLarge,
    ErrorCode.TRUNCATED: Truncated,
    ErrorCode.CORRUPT: CorruptData,
    ErrorCode.NOT_FOUND: NotFound,
    ErrorCode.CONFLICT: Conflict,
    ErrorCode.IN_USE: InUse,
    ErrorCode.STORAGE_FULL: StorageFull,
    ErrorCode.CLOSED: Closed,
    ErrorCode.TXN_ABORTED: TxnAborted,
    ErrorCode.PERMISSION_DENIED: PermissionDenied,
    ErrorCode.FLUSH_BEHIND: FlushBehind,
    ErrorCode.WRITES_STOPPED: WritesStopped,
    ErrorCode.INTERNAL: HeadraceError,
}


def error_class(code: ErrorCode) -> type[HeadraceError]:
    """The exception class raised for a wire error code."""
    return _BY_CODE[code]
