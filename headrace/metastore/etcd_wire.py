"""Pure translation between the metastore contract and etcd's v3 protocol
(the protobuf messages shipped with aetcd): endpoints, requests, responses and
errors. No I/O here; :mod:`headrace.metastore.etcd` does the calls."""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Sequence
from typing import Any

import grpc
from aetcd import rpc

from headrace import errors
from headrace.metastore.contract import (
    Compare,
    CompareOp,
    Delete,
    EventType,
    KeyValue,
    LeaseExpired,
    Op,
    Put,
    Target,
    WatchEvent,
)
from headrace.metastore.etcd_security import (
    ENV_CACERT,
    ENV_PASSWORD_FILE,
    ENV_USER,
    PLAINTEXT,
    EtcdSecurity,
)
from headrace.metastore.ranges import check_compare, check_ops, encode_key, prefix_end

DEFAULT_PORT = 2379
Endpoint = tuple[str, int]

_RESULTS = {
    CompareOp.EQUAL: rpc.Compare.EQUAL,
    CompareOp.NOT_EQUAL: rpc.Compare.NOT_EQUAL,
    CompareOp.LESS: rpc.Compare.LESS,
    CompareOp.GREATER: rpc.Compare.GREATER,
}
_TARGETS = {
    Target.VALUE: (rpc.Compare.VALUE, "value"),
    Target.VERSION: (rpc.Compare.VERSION, "version"),
    Target.CREATE_REVISION: (rpc.Compare.CREATE, "create_revision"),
    Target.MOD_REVISION: (rpc.Compare.MOD, "mod_revision"),
    Target.LEASE: (rpc.Compare.LEASE, "lease"),
}


def parse_endpoints(text: str) -> list[Endpoint]:
    """``host:port[,host:port...]`` (IPv6 hosts in brackets; port defaults to 2379)."""
    endpoints: list[Endpoint] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise errors.InvalidArgument(f"empty etcd endpoint in {text!r}")
        if item.startswith("["):
            host, sep, rest = item[1:].partition("]")
            if not sep or (rest and not rest.startswith(":")):
                raise errors.InvalidArgument(f"malformed etcd endpoint {item!r}")
            port_text = rest[1:]
        else:
            host, _, port_text = item.partition(":")
        if not host or "/" in host or "@" in host:
            raise errors.InvalidArgument(f"malformed etcd endpoint {item!r}")
        if not port_text:
            port = DEFAULT_PORT
        elif port_text.isdigit() and 0 < int(port_text) < 65536:
            port = int(port_text)
        else:
            raise errors.InvalidArgument(f"bad port in etcd endpoint {item!r}")
        endpoints.append((host, port))
    return endpoints


def format_endpoint(endpoint: Endpoint) -> str:
    host, port = endpoint
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def channel_target(endpoints: Sequence[Endpoint]) -> str:
    """A gRPC target for the endpoints (several must be IP addresses of one family)."""
    if len(endpoints) == 1:
        return format_endpoint(endpoints[0])
    try:
        families = {ipaddress.ip_address(host).version for host, _ in endpoints}
    except ValueError:
        raise errors.InvalidArgument(
            "several etcd endpoints must be IP addresses (resolve names first): "
            + ",".join(format_endpoint(e) for e in endpoints)
        ) from None
    if len(families) != 1:
        raise errors.InvalidArgument("several etcd endpoints must all be IPv4 or all IPv6")
    scheme = "ipv4" if families == {4} else "ipv6"
    return f"{scheme}:" + ",".join(format_endpoint(e) for e in endpoints)


def lease_ttl_seconds(ttl: float) -> int:
    """etcd leases have whole seconds (the server may raise them to its minimum)."""
    return max(1, math.ceil(ttl))


def to_kv(kv: Any) -> KeyValue:
    return KeyValue(
        bytes(kv.key).decode(),
        bytes(kv.value),
        int(kv.create_revision),
        int(kv.mod_revision),
        int(kv.version),
        int(kv.lease),
    )


def to_event(event: Any) -> WatchEvent:
    if event.type == rpc.Event.DELETE:
        return WatchEvent(
            EventType.DELETE,
            KeyValue(bytes(event.kv.key).decode(), b"", 0, event.kv.mod_revision, 0),
        )
    return WatchEvent(EventType.PUT, to_kv(event.kv))


def range_request(key: str, prefix: bool) -> Any:
    start = encode_key(key, prefix=prefix)
    if not prefix:
        return rpc.RangeRequest(key=start)
    end = prefix_end(start)
    return rpc.RangeRequest(key=start or b"\0", range_end=b"\0" if end is None else end)


def delete_request(key: str, prefix: bool) -> Any:
    span = range_request(key, prefix)
    return rpc.DeleteRangeRequest(key=span.key, range_end=span.range_end)


def watch_create_request(prefix: str, start_revision: int) -> Any:
    span = range_request(prefix, True)
    create = rpc.WatchCreateRequest(
        key=span.key, range_end=span.range_end, start_revision=max(0, start_revision)
    )
    return rpc.WatchRequest(create_request=create)


def _compare(compare: Compare) -> Any:
    target, field = _TARGETS[compare.target]
    message = rpc.Compare(key=encode_key(compare.key), target=target, result=_RESULTS[compare.op])
    setattr(message, field, compare.value)
    return message


def _request_op(op: Op) -> Any:
    if isinstance(op, Put):
        return rpc.RequestOp(
            request_put=rpc.PutRequest(key=encode_key(op.key), value=op.value, lease=op.lease)
        )
    if isinstance(op, Delete):
        return rpc.RequestOp(request_delete_range=delete_request(op.key, op.prefix))
    return rpc.RequestOp(request_range=range_request(op.key, op.prefix))


def _missing_or_unequal(compare: Compare) -> bool:
    return compare.target is Target.VALUE and compare.op is CompareOp.NOT_EQUAL


def txn_request(
    compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]
) -> tuple[Any, int]:
    """The TxnRequest and its nesting depth.

    etcd fails every value compare on a missing key, while the contract says a
    missing key's value is unequal to everything. Each ``value != x`` compare
    therefore becomes a nested transaction branching on ``version == 0``: the
    missing-key branch drops the compare, the present-key branch keeps it. The
    caller unwraps ``depth`` levels of ``response_txn`` to reach the real result.
    """
    for compare in compares:
        check_compare(compare)
    check_ops(success)
    check_ops(failure)
    plain = [_compare(c) for c in compares if not _missing_or_unequal(c)]
    special = [c for c in compares if _missing_or_unequal(c)]
    then_ops = [_request_op(op) for op in success]
    else_ops = [_request_op(op) for op in failure]
    return _nest(plain, special, then_ops, else_ops), len(special)


def _nest(
    plain: list[Any], special: list[Compare], then_ops: list[Any], else_ops: list[Any]
) -> Any:
    if not special:
        return rpc.TxnRequest(compare=plain, success=then_ops, failure=else_ops)
    head, rest = special[0], special[1:]
    absent = rpc.Compare(
        key=encode_key(head.key), target=rpc.Compare.VERSION, result=rpc.Compare.EQUAL, version=0
    )
    when_absent = _nest(plain, rest, then_ops, else_ops)
    when_present = _nest([*plain, _compare(head)], rest, then_ops, else_ops)
    return rpc.TxnRequest(
        compare=[absent],
        success=[rpc.RequestOp(request_txn=when_absent)],
        failure=[rpc.RequestOp(request_txn=when_present)],
    )


def unwrap_txn(response: Any, depth: int) -> Any:
    for _ in range(depth):
        response = response.responses[0].response_txn
    return response


class TokenRejected(errors.PermissionDenied):
    """etcd no longer accepts the auth token (expired, or the auth store changed):
    authenticate again and repeat the call."""


def auth_not_enabled(exc: grpc.aio.AioRpcError) -> bool:
    """Whether an Authenticate call failed only because etcd has auth off."""
    details = exc.details() or ""
    return exc.code() is grpc.StatusCode.FAILED_PRECONDITION and "not enabled" in details


def _tls_failure(details: str, where: str, security: EtcdSecurity) -> errors.HeadraceError | None:
    """The error for a failed TLS connection, if ``details`` describe one.

    gRPC names a server certificate the client does not trust; a client
    certificate etcd refuses (missing, expired, unknown CA) shows only as data
    that cannot be decrypted right after the handshake (TLS 1.3 alerts arrive
    then), so that error lists the possible reasons."""
    if "CERTIFICATE_VERIFY_FAILED" in details or "handshake failed" in details.lower():
        trusted = f"{ENV_CACERT}={security.ca_file}" if security.ca_file else "the system's CAs"
        return errors.PermissionDenied(
            f"TLS handshake with {where} failed: its server certificate is not "
            f"trusted by {trusted} ({details})"
        )
    if "TSI_DATA_CORRUPTED" in details or "Unwrap failed" in details:
        given = (
            f"the client certificate {security.cert_file}"
            if security.cert_file
            else "no client certificate"
        )
        return errors.PermissionDenied(
            f"{where} refused the TLS connection after the handshake, as it does when it "
            f"rejects a client certificate: this client presented {given}; etcd needs one "
            f"signed by its --trusted-ca-file CA and not expired ({details})"
        )
    return None


def _auth_failure(
    code: grpc.StatusCode, details: str, where: str, security: EtcdSecurity
) -> errors.HeadraceError | None:
    """The error for a refused identity or permission, if ``details`` say so."""
    client = security.describe_client()
    if code is grpc.StatusCode.UNAUTHENTICATED or "auth store is old" in details:
        return TokenRejected(f"{where} rejected the auth token of {client}: {details}")
    if code is grpc.StatusCode.PERMISSION_DENIED:
        why = (
            f"the roles of user {security.user!r} lack the permission on this key range"
            if security.user
            else "without a user, etcd acts as the client certificate's common name: "
            f"no such etcd user, or its roles lack the permission (or set {ENV_USER})"
        )
        return errors.PermissionDenied(f"{where} denied the request to {client}: {details} ({why})")
    if "authentication failed" in details:
        return errors.PermissionDenied(
            f"{where} rejected {client}: wrong user name or password "
            f"({ENV_USER}, {ENV_PASSWORD_FILE}): {details}"
        )
    if "user name is empty" in details or "user name not found" in details:
        return errors.PermissionDenied(
            f"{where} has authentication on and was given {client}: set {ENV_USER} and "
            f"{ENV_PASSWORD_FILE}, or a client certificate whose common name is an etcd user "
            f"({details})"
        )
    return None


def translate(
    exc: grpc.aio.AioRpcError, target: str, security: EtcdSecurity = PLAINTEXT
) -> errors.HeadraceError:
    """The Headrace error for a failed etcd call to ``target`` made with ``security``."""
    code = exc.code()
    details = exc.details() or code.name
    where = f"etcd at {target}"
    if code is grpc.StatusCode.NOT_FOUND and "lease not found" in details:
        return LeaseExpired(f"{where}: {details}")
    refused = _auth_failure(code, details, where, security)
    if refused is not None:
        return refused
    if code is grpc.StatusCode.UNAVAILABLE and security.tls:
        tls_failure = _tls_failure(details, where, security)
        if tls_failure is not None:
            return tls_failure
        if "Handshake read failed" in details:
            return errors.Unavailable(
                f"{where} closed the connection during the TLS handshake (is it serving "
                f"TLS, as etcds:// expects? or going down?): {details}"
            )
    if code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.ABORTED,
    ):
        return errors.Unavailable(f"{where} does not answer: {details}")
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        if "space exceeded" in details:
            return errors.StorageFull(f"{where}: {details}")
        return errors.Unavailable(f"{where} is overloaded: {details}")
    if code is grpc.StatusCode.OUT_OF_RANGE and "compacted" in details:
        return errors.Truncated(f"{where}: {details}")
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        return errors.InvalidArgument(f"{where} rejected the request: {details}")
    return errors.HeadraceError(f"{where}: {code.name}: {details}")
