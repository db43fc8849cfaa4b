"""Headrace errors on the wire, node side.

Per-message failures travel as :class:`streaming_pb2.Error` inside the
response; a failure of a whole stream or call ends it with a gRPC status code
and the same fields as JSON in the trailing metadata key ``headrace-error``.
"""

from __future__ import annotations

import json
import logging
from typing import Any, NoReturn

import grpc

from headrace import errors
from headrace.proto import streaming_pb2 as pb

log = logging.getLogger(__name__)

METADATA_KEY = "headrace-error"

STATUS_OF_CODE: dict[errors.ErrorCode, grpc.StatusCode] = {
    errors.ErrorCode.NOT_OWNER: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ErrorCode.FENCED: grpc.StatusCode.ABORTED,
    errors.ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    errors.ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    errors.ErrorCode.TOO_LARGE: grpc.StatusCode.INVALID_ARGUMENT,
    errors.ErrorCode.TRUNCATED: grpc.StatusCode.OUT_OF_RANGE,
    errors.ErrorCode.CORRUPT: grpc.StatusCode.DATA_LOSS,
    errors.ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    errors.ErrorCode.CONFLICT: grpc.StatusCode.ABORTED,
    errors.ErrorCode.IN_USE: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ErrorCode.STORAGE_FULL: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.ErrorCode.CLOSED: grpc.StatusCode.UNAVAILABLE,
    errors.ErrorCode.TXN_ABORTED: grpc.StatusCode.ABORTED,
    errors.ErrorCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    errors.ErrorCode.FLUSH_BEHIND: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.ErrorCode.WRITES_STOPPED: grpc.StatusCode.UNAVAILABLE,
    errors.ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
}


def to_proto(exc: errors.HeadraceError) -> pb.Error:
    """The wire form of ``exc``, with the hints its class carries."""
    out = pb.Error(code=exc.code.value, message=exc.message, retryable=exc.retryable)
    if isinstance(exc, errors.NotOwner):
        out.owner = exc.owner
        out.term = exc.term
        if isinstance(exc, NotOwnerAt):
            out.owner_address = exc.address
    elif isinstance(exc, errors.Fenced):
        out.term = exc.term
        out.current_term = exc.current_term
    elif isinstance(exc, errors.Truncated):
        out.earliest = exc.earliest
    return out


class NotOwnerAt(errors.NotOwner):
    """A NotOwner that also names the owner's address, for the wire's hint."""

    def __init__(self, message: str, *, owner: str = "", term: int = 0, address: str = "") -> None:
        super().__init__(message, owner=owner, term=term)
        self.address = address


def to_json(exc: errors.HeadraceError) -> str:
    proto = to_proto(exc)
    fields: dict[str, object] = {
        "code": proto.code,
        "message": proto.message,
        "retryable": proto.retryable,
    }
    for name in ("owner", "owner_address", "term", "current_term", "earliest"):
        value = getattr(proto, name)
        if value:
            fields[name] = value
    return json.dumps(fields, separators=(",", ":"))


def as_headrace(exc: BaseException) -> errors.HeadraceError:
    """``exc`` itself if it is a Headrace error, else an INTERNAL one naming it."""
    if isinstance(exc, errors.HeadraceError):
        return exc
    log.exception("unexpected error in a request handler", exc_info=exc)
    return errors.HeadraceError(f"internal error: {type(exc).__name__}: {exc}")


async def abort(context: grpc.aio.ServicerContext[Any, Any], exc: errors.HeadraceError) -> NoReturn:
    """End the call with ``exc``'s status code and details in trailing metadata."""
    await context.abort(
        STATUS_OF_CODE.get(exc.code, grpc.StatusCode.INTERNAL),
        str(exc),
        trailing_metadata=((METADATA_KEY, to_json(exc)),),
    )
