"""TLS and authentication for the test bed's etcd (the ``secure`` mode).

:func:`prepare` writes the certificates (:func:`headrace_testbed.pki.write_etcd_pki`)
and the users' password files; :func:`server_flags` are etcd's flags for
HTTPS with client certificates required; :func:`enable_auth` does what
``etcdctl user add`` / ``role grant-permission`` / ``auth enable`` do, over
etcd's gRPC API (the protocol messages aetcd ships), with the valid client
certificate:

* ``root`` (role ``root``), required by etcd before auth can be enabled;
* :data:`WRITER` with read-write on every key (what a Headrace process needs);
* :data:`READER` with read-only on every key (to see PERMISSION_DENIED).

Simple tokens expire after ``token_ttl_s`` seconds without use, so a client
that keeps working must authenticate again.
"""

from __future__ import annotations

import dataclasses
import secrets
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from aetcd import rpc

from headrace_testbed import TestbedError
from headrace_testbed.pki import ETCD_CLIENT, EtcdPki, write_etcd_pki

WRITER = "headrace"
"""Read-write on every key; also the common name of the valid client certificate."""
READER = "reader"
ROOT = "root"
TOKEN_TTL_S = 3
"""etcd's ``--auth-token-ttl`` in the secure mode: short, so tests see tokens expire."""
_CALL_TIMEOUT_S = 10.0
Metadata = tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class EtcdAuth:
    """What a secure test etcd was given: certificates and the users' password files."""

    pki: EtcdPki

    def password_file(self, user: str) -> Path:
        return self.pki.directory / f"{user}.password"

    def password(self, user: str) -> str:
        return self.password_file(user).read_text(encoding="utf-8").strip()

    def ssl_context(self) -> ssl.SSLContext:
        """A client context trusting the CA and presenting the valid client certificate."""
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(self.pki.cert(ETCD_CLIENT), self.pki.key(ETCD_CLIENT))
        return context


def prepare(directory: Path) -> EtcdAuth:
    """Certificates and a random password per user, under ``directory``."""
    auth = EtcdAuth(write_etcd_pki(directory))
    for user in (ROOT, WRITER, READER):
        path = auth.password_file(user)
        path.write_text(secrets.token_urlsafe(16) + "\n", encoding="utf-8")
        path.chmod(0o600)
    return auth


def server_flags(auth: EtcdAuth) -> list[str]:
    """etcd's flags for TLS on the client port with client certificates required."""
    pki = auth.pki
    return [
        f"--cert-file={pki.cert('server')}",
        f"--key-file={pki.key('server')}",
        f"--trusted-ca-file={pki.ca_cert}",
        "--client-cert-auth",
        "--auth-token=simple",
        f"--auth-token-ttl={TOKEN_TTL_S}",
    ]


def _channel(auth: EtcdAuth, endpoint: str) -> grpc.Channel:
    pki = auth.pki
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.ca_cert.read_bytes(),
        private_key=pki.key(ETCD_CLIENT).read_bytes(),
        certificate_chain=pki.cert(ETCD_CLIENT).read_bytes(),
    )
    return grpc.secure_channel(endpoint, credentials)


def _all_keys(permission: int) -> rpc.Permission:
    return rpc.Permission(permType=permission, key=b"\0", range_end=b"\0")


def enable_auth(auth: EtcdAuth, endpoint: str) -> None:
    """Create the users and roles, then turn authentication on."""
    with _channel(auth, endpoint) as channel:
        stub = rpc.AuthStub(channel)
        roles = {WRITER: rpc.Permission.READWRITE, READER: rpc.Permission.READ}
        try:
            for role, permission in roles.items():
                stub.RoleAdd(rpc.AuthRoleAddRequest(name=role), timeout=_CALL_TIMEOUT_S)
                stub.RoleGrantPermission(
                    rpc.AuthRoleGrantPermissionRequest(name=role, perm=_all_keys(permission)),
                    timeout=_CALL_TIMEOUT_S,
                )
            for user, role in ((ROOT, ROOT), (WRITER, WRITER), (READER, READER)):
                stub.UserAdd(
                    rpc.AuthUserAddRequest(name=user, password=auth.password(user)),
                    timeout=_CALL_TIMEOUT_S,
                )
                stub.UserGrantRole(
                    rpc.AuthUserGrantRoleRequest(user=user, role=role), timeout=_CALL_TIMEOUT_S
                )
            stub.AuthEnable(rpc.AuthEnableRequest(), timeout=_CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise TestbedError(
                f"cannot enable authentication on etcd at {endpoint}: {exc}"
            ) from exc


def _as_root(auth: EtcdAuth, endpoint: str, request: Callable[[Any, Metadata], object]) -> None:
    """Run ``request(auth_stub, metadata)`` authenticated as root."""
    with _channel(auth, endpoint) as channel:
        stub = rpc.AuthStub(channel)
        try:
            token = stub.Authenticate(
                rpc.AuthenticateRequest(name=ROOT, password=auth.password(ROOT)),
                timeout=_CALL_TIMEOUT_S,
            ).token
            request(stub, (("token", token),))
        except grpc.RpcError as exc:
            raise TestbedError(f"etcd at {endpoint} refused an admin request: {exc}") from exc


def add_user(auth: EtcdAuth, endpoint: str, user: str, password: str, role: str) -> None:
    """``etcdctl user add`` and ``user grant-role``, as root."""

    def request(stub: Any, metadata: Metadata) -> None:
        add = rpc.AuthUserAddRequest(name=user, password=password)
        stub.UserAdd(add, timeout=_CALL_TIMEOUT_S, metadata=metadata)
        grant = rpc.AuthUserGrantRoleRequest(user=user, role=role)
        stub.UserGrantRole(grant, timeout=_CALL_TIMEOUT_S, metadata=metadata)

    _as_root(auth, endpoint, request)


def change_password(auth: EtcdAuth, endpoint: str, user: str, password: str) -> None:
    """``etcdctl user passwd``, as root."""

    def request(stub: Any, metadata: Metadata) -> None:
        change = rpc.AuthUserChangePasswordRequest(name=user, password=password)
        stub.UserChangePassword(change, timeout=_CALL_TIMEOUT_S, metadata=metadata)

    _as_root(auth, endpoint, request)
