"""Headrace errors on the wire, client side: back into :mod:`headrace.errors` types.

The node sends per-message failures as ``Error`` protos and stream failures as
a gRPC status with the same fields, JSON-encoded, in the trailing metadata key
``headrace-error``. Without that key (the node was unreachable, the stream
broke) the gRPC status code decides.
"""

from __future__ import annotations

import json
from typing import Any

import grpc

from headrace import errors
from headrace.proto import streaming_pb2 as pb

METADATA_KEY = "headrace-error"

_RETRYABLE_STATUS = frozenset(
    {
        # Without Headrace details (a node always sends them), INTERNAL comes
        # from gRPC's transport, e.g. "Internal error from Core" when the peer
        # dies mid-stream: the outcome is unknown, and retries are deduplicated.
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.UNKNOWN,
        # The address answers but serves no such method: the node that was
        # there is gone and another server took its port (or the node is of a
        # release without it). Found through discovery, the owner is looked up
        # again; the messages' deadline bounds the retries.
        grpc.StatusCode.UNIMPLEMENTED,
    }
)

_UNIMPLEMENTED_HINT = (
    " (the server at this address does not serve this Headrace call: the node that was"
    " there has gone, or it runs a release without it)"
)


class NotOwnerAt(errors.NotOwner):
    """A NotOwner whose node also named the owner's address."""

    def __init__(self, message: str, *, owner: str = "", term: int = 0, address: str = "") -> None:
        super().__init__(message, owner=owner, term=term)
        self.address = address


def build(
    code: str,
    message: str,
    *,
    retryable: bool | None = None,
    owner: str = "",
    owner_address: str = "",
    term: int = 0,
    current_term: int = 0,
    earliest: str = "",
) -> errors.HeadraceError:
    """The Headrace error for wire fields; an unknown code is INTERNAL."""
    try:
        error_code = errors.ErrorCode(code)
    except ValueError:
        return errors.HeadraceError(f"{code}: {message}", retryable=bool(retryable))
    cls = errors.error_class(error_code)
    exc: errors.HeadraceError
    if cls is errors.NotOwner:
        exc = NotOwnerAt(message, owner=owner, term=term, address=owner_address)
    elif cls is errors.Fenced:
        exc = errors.Fenced(message, term=term, current_term=current_term)
    elif cls is errors.Truncated:
        exc = errors.Truncated(message, earliest=earliest)
    else:
        exc = cls(message)
    if retryable is not None:
        exc.retryable = retryable
    return exc


def from_proto(error: pb.Error) -> errors.HeadraceError:
    return build(
        error.code,
        error.message,
        retryable=error.retryable,
        owner=error.owner,
        owner_address=error.owner_address,
        term=error.term,
        current_term=error.current_term,
        earliest=error.earliest,
    )


def from_json(text: str) -> errors.HeadraceError:
    try:
        fields = json.loads(text)
        if not isinstance(fields, dict):
            raise TypeError("not an object")
        return build(
            str(fields.get("code", "INTERNAL")),
            str(fields.get("message", "")),
            retryable=bool(fields.get("retryable", False)),
            owner=str(fields.get("owner", "")),
            owner_address=str(fields.get("owner_address", "")),
            term=int(fields.get("term", 0)),
            current_term=int(fields.get("current_term", 0)),
            earliest=str(fields.get("earliest", "")),
        )
    except (ValueError, TypeError) as exc:
        return errors.HeadraceError(f"malformed error details from the node: {exc}: {text[:200]}")


def from_rpc_error(exc: grpc.RpcError, where: str) -> errors.HeadraceError:
    """Translate a failed gRPC call to ``where`` (an address or a description)."""
    code = grpc.StatusCode.UNKNOWN
    details = str(exc)
    if isinstance(exc, grpc.aio.AioRpcError):
        code = exc.code()
        details = exc.details() or ""
        # grpc.aio returns an aio.Metadata of (key, value) pairs at run time.
        metadata: Any = exc.trailing_metadata()
        for key, value in metadata or ():
            if key == METADATA_KEY:
                text = value.decode() if isinstance(value, bytes) else str(value)
                return from_json(text)
    message = f"{where}: {code.name}: {details}"
    if code is grpc.StatusCode.UNIMPLEMENTED:
        message += _UNIMPLEMENTED_HINT
    if code in _RETRYABLE_STATUS:
        return errors.Unavailable(message)
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        return errors.InvalidArgument(message)
    return errors.HeadraceError(message)
