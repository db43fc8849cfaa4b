"""The operator's errors: :mod:`headrace.errors` types with Kubernetes meaning.

Kubernetes API failures are translated into these in :mod:`.kube` (the only
module that calls the ``kubernetes`` client); every error says whether a later
reconcile pass may succeed (``retryable``). Handlers turn retryable errors into
a delayed retry and permanent ones into a ``Degraded`` condition and an Event.
"""

from __future__ import annotations

from headrace import errors


class OperatorError(errors.HeadraceError):
    """Base of the operator's own errors."""


class KubeUnavailable(errors.Unavailable):
    """The API server did not answer, or answered 429/5xx: retry later."""


class KubeConflict(errors.Conflict):
    """Somebody else changed the object first (409); the next pass re-reads it."""

    retryable = True


class KubeForbidden(OperatorError):
    """The operator's RBAC does not allow the request (403): fix the Role."""

    code = errors.ErrorCode.INVALID_ARGUMENT


class KubeInvalid(errors.InvalidArgument):
    """The API server rejected the object (400/422): a bug or an invalid spec."""


class KubeNotFound(errors.NotFound):
    """The object or its API (e.g. a CRD not installed) does not exist."""


class InvalidSpec(errors.InvalidArgument):
    """A custom resource's spec violates the operator's model.

    ``field`` is the dotted path of the offending field (e.g. ``spec.wal.kafka``).
    """

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class BackendUnreachable(errors.Unavailable):
    """The metastore or the WAL backend of a cluster does not answer."""

    def __init__(self, message: str, *, backend: str) -> None:
        super().__init__(message)
        self.backend = backend
