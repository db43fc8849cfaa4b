"""Who may call what on a node: identities, roles, and the gRPC interceptor.

An identities file (``headrace node --auth-file FILE``, JSON) names each
caller, how it is recognised and its roles::

    {"identities": [
      {"name": "orders-app", "roles": ["producer", "consumer"],
       "token_sha256": "<hex SHA-256 of the bearer token>"},
      {"name": "ops", "roles": ["admin"], "certificate_cn": "ops"}
    ]}

A caller is recognised by its bearer token (``authorization: Bearer ...``,
compared by SHA-256, so the file holds no token) or by the common name of its
client certificate (mutual TLS). ``Produce`` needs ``producer``, ``Consume``
needs ``consumer``, opening and closing WALs (the Manager service) needs
``admin``, which implies the others; listing WALs needs any identity. Health
checks are open (probes). The file is read again when it changes.

A call without a known identity, or without the role, is refused with
PERMISSION_DENIED naming the role it lacked, and logged.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from headrace import errors
from headrace.node.errors import abort

log = logging.getLogger(__name__)


class Role(enum.StrEnum):
    PRODUCER = "producer"
    CONSUMER = "consumer"
    ADMIN = "admin"


ANY_IDENTITY = "any identity"
_PACKAGE = "/headrace.v1."
REQUIRED: Mapping[str, Role | str] = {
    f"{_PACKAGE}Producer/Produce": Role.PRODUCER,
    f"{_PACKAGE}Consumer/Consume": Role.CONSUMER,
    f"{_PACKAGE}Manager/OpenWAL": Role.ADMIN,
    f"{_PACKAGE}Manager/CloseWAL": Role.ADMIN,
    f"{_PACKAGE}Manager/ListWALs": ANY_IDENTITY,
}
OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


@dataclasses.dataclass(frozen=True)
class Identity:
    name: str
    roles: frozenset[Role]
    token_sha256: str = ""
    certificate_cn: str = ""

    def has(self, role: Role) -> bool:
        return role in self.roles or Role.ADMIN in self.roles


@dataclasses.dataclass(frozen=True)
class Caller:
    """What a call presents: a bearer token and/or a certificate common name."""

    token: str = ""
    certificate_cn: str = ""


def parse_identities(text: str, source: str) -> tuple[Identity, ...]:
    """The identities of a file's text; InvalidArgument naming what is wrong (pure)."""
    try:
        doc = json.loads(text)
        entries = doc["identities"]
        if not isinstance(entries, list):
            raise TypeError("identities is not a list")
        identities = []
        for i, entry in enumerate(entries):
            name = str(entry["name"])
            roles = frozenset(Role(r) for r in entry["roles"])
            token = str(entry.get("token_sha256", "")).lower()
            cn = str(entry.get("certificate_cn", ""))
            if not token and not cn:
                raise ValueError(
                    f"identity {i} ({name}) has neither token_sha256 nor certificate_cn"
                )
            if token and (len(token) != 64 or any(c not in "0123456789abcdef" for c in token)):
                raise ValueError(f"identity {i} ({name}): token_sha256 is not 64 hex digits")
            identities.append(Identity(name, roles, token, cn))
    except (ValueError, TypeError, KeyError) as exc:
        raise errors.InvalidArgument(
            f"identities file {source}: {type(exc).__name__}: {exc} (roles are "
            f"{', '.join(r.value for r in Role)})"
        ) from None
    return tuple(identities)


def identify(caller: Caller, identities: Sequence[Identity]) -> Identity | None:
    """The identity ``caller`` proves, if any (pure; tokens compared in constant time)."""
    digest = hashlib.sha256(caller.token.encode()).hexdigest() if caller.token else ""
    for identity in identities:
        if digest and identity.token_sha256 and hmac.compare_digest(digest, identity.token_sha256):
            return identity
        if caller.certificate_cn and identity.certificate_cn == caller.certificate_cn:
            return identity
    return None


def refusal(method: str, caller: Caller, identities: Sequence[Identity]) -> str:
    """Why ``caller`` may not call ``method``; empty when it may (pure)."""
    if method.startswith(OPEN_PREFIXES):
        return ""
    required = REQUIRED.get(method, Role.ADMIN)
    identity = identify(caller, identities)
    if identity is None:
        presented = "a token" if caller.token else ""
        if caller.certificate_cn:
            presented += (" and " if presented else "") + f"certificate CN={caller.certificate_cn}"
        return (
            f"{method} needs role {required}: the caller is not authenticated "
            f"({presented or 'no token and no client certificate'} matches no identity)"
        )
    if isinstance(required, Role) and not identity.has(required):
        return f"{method} needs role {required}; {identity.name} has {sorted(identity.roles)}"
    return ""


class IdentitiesFile:
    """The identities of a file, read again when it changes (a file that no
    longer parses keeps the previous identities, with a warning)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = self._file_stamp()
        self.identities = parse_identities(self._text(), str(path))

    def _text(self) -> str:
        try:
            return self.path.read_text()
        except OSError as exc:
            raise errors.InvalidArgument(
                f"cannot read the identities file {self.path}: {exc.strerror}"
            ) from None

    def _file_stamp(self) -> tuple[int, int]:
        try:
            st = self.path.stat()
        except OSError:
            return (-1, -1)
        return (st.st_mtime_ns, st.st_size)

    def current(self) -> tuple[Identity, ...]:
        stamp = self._file_stamp()
        if stamp != self._stamp:
            try:
                self.identities = parse_identities(self._text(), str(self.path))
            except errors.HeadraceError as exc:
                log.warning("keeping the previous identities: %s", exc)
            self._stamp = stamp
        return self.identities


def _bearer(metadata: Sequence[tuple[str, str | bytes]] | None) -> str:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return ""


def _certificate_cn(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    names = list(context.auth_context().get("x509_common_name") or ())
    return names[0].decode() if names else ""


Check = Callable[[grpc.aio.ServicerContext[Any, Any]], Awaitable[None]]


def _guarded(handler: Any, check: Check) -> Any:
    """``handler`` with ``check`` run first in every call."""
    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        unary = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            await check(context)
            return await unary(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **kwargs)
    if handler.unary_stream is not None:
        stream = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            await check(context)
            async for response in stream(request, context):
                yield response

        return grpc.unary_stream_rpc_method_handler(unary_stream, **kwargs)
    if handler.stream_stream is not None:
        both = handler.stream_stream

        async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
            await check(context)
            async for response in both(requests, context):
                yield response

        return grpc.stream_stream_rpc_method_handler(stream_stream, **kwargs)
    stream_in = handler.stream_unary

    async def stream_unary(requests: Any, context: Any) -> Any:
        await check(context)
        return await stream_in(requests, context)

    return grpc.stream_unary_rpc_method_handler(stream_unary, **kwargs)


if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Refuses calls whose caller lacks the method's role (see the module doc)."""

    def __init__(self, identities: IdentitiesFile) -> None:
        self.identities = identities
        self.denied = 0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(OPEN_PREFIXES):
            return handler
        token = _bearer(handler_call_details.invocation_metadata)

        async def check(context: grpc.aio.ServicerContext[Any, Any]) -> None:
            caller = Caller(token, _certificate_cn(context))
            why = refusal(method, caller, self.identities.current())
            if why:
                self.denied += 1
                log.warning("denied %s from %s: %s", method, context.peer(), why)
                await abort(context, errors.PermissionDenied(why))

        guarded: Handler = _guarded(handler, check)
        return guarded
