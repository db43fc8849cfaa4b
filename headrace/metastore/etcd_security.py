"""TLS and authentication settings of the etcd metastore client.

They come from the environment (or a caller's :class:`EtcdSecurity`), never
from the command line, where a password would be visible to ``ps``:

* ``HEADRACE_ETCD_CACERT``: PEM file of the CA that signed etcd's server
  certificate (without it, the system's trusted roots);
* ``HEADRACE_ETCD_CERT`` and ``HEADRACE_ETCD_KEY``: the client certificate and
  its key, for an etcd run with ``--client-cert-auth`` (etcd takes the
  certificate's common name as the user when no password is given);
* ``HEADRACE_ETCD_USER`` and ``HEADRACE_ETCD_PASSWORD_FILE``: an etcd user and
  the file holding its password (one line; a trailing newline is dropped),
  read again whenever the client authenticates (a rotated Secret is picked up).

TLS is chosen by the URL: ``etcds://host:port`` speaks TLS, ``etcd://`` does
not, and certificate settings with an ``etcd://`` URL are an error rather than
silently unused. Files are read when the store is opened; a client
certificate outside its validity period is refused before dialing, since etcd
rejects it in a way gRPC reports only as a closed connection.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
from collections.abc import Mapping
from pathlib import Path

from headrace import errors

ENV_CACERT = "HEADRACE_ETCD_CACERT"
ENV_CERT = "HEADRACE_ETCD_CERT"
ENV_KEY = "HEADRACE_ETCD_KEY"
ENV_USER = "HEADRACE_ETCD_USER"
ENV_PASSWORD_FILE = "HEADRACE_ETCD_PASSWORD_FILE"
ENV_NAMES = (ENV_CACERT, ENV_CERT, ENV_KEY, ENV_USER, ENV_PASSWORD_FILE)


@dataclasses.dataclass(frozen=True, slots=True)
class EtcdSecurity:
    """How to reach etcd securely: TLS files and a user (paths, not contents)."""

    tls: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    user: str = ""
    password_file: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, tls: bool) -> EtcdSecurity:
        """The settings in ``env`` (see the module docstring), checked (pure)."""
        return cls(
            tls=tls,
            ca_file=env.get(ENV_CACERT, ""),
            cert_file=env.get(ENV_CERT, ""),
            key_file=env.get(ENV_KEY, ""),
            user=env.get(ENV_USER, ""),
            password_file=env.get(ENV_PASSWORD_FILE, ""),
        ).checked()

    def checked(self) -> EtcdSecurity:
        """``self`` if its settings fit together, else InvalidArgument saying which do not."""
        tls_files = {ENV_CACERT: self.ca_file, ENV_CERT: self.cert_file, ENV_KEY: self.key_file}
        given = [name for name, value in tls_files.items() if value]
        if given and not self.tls:
            raise errors.InvalidArgument(
                f"{', '.join(given)} set for a plaintext etcd:// metastore URL: "
                "use etcds://host:port to speak TLS to etcd"
            )
        if bool(self.cert_file) != bool(self.key_file):
            raise errors.InvalidArgument(
                f"an etcd client certificate needs both {ENV_CERT} and {ENV_KEY}"
            )
        if bool(self.user) != bool(self.password_file):
            raise errors.InvalidArgument(
                f"etcd password authentication needs both {ENV_USER} and {ENV_PASSWORD_FILE}"
            )
        return self

    def describe_client(self) -> str:
        """Who this client is to etcd, for error messages (never the password)."""
        parts = []
        if self.user:
            parts.append(f"user {self.user!r}")
        if self.cert_file:
            parts.append(f"client certificate {self.cert_file}")
        return " with ".join(parts) if parts else "no user and no client certificate"


PLAINTEXT = EtcdSecurity()
"""No TLS, no user: etcd as the test bed runs it by default."""


@dataclasses.dataclass(frozen=True, slots=True)
class EtcdCredentials:
    """The contents of the TLS files an :class:`EtcdSecurity` names."""

    tls: bool
    root_certificates: bytes | None
    private_key: bytes | None
    certificate_chain: bytes | None


def _read(name: str, path: str, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise errors.InvalidArgument(
            f"cannot read the etcd {what} {name}={path}: {exc.strerror or exc}"
        ) from None
    if not data.strip():
        raise errors.InvalidArgument(f"the etcd {what} {name}={path} is empty")
    return data


def _read_pem(name: str, path: str, what: str) -> bytes:
    data = _read(name, path, what)
    if b"-----BEGIN " not in data:
        raise errors.InvalidArgument(f"the etcd {what} {name}={path} is not a PEM file")
    return data


def load(security: EtcdSecurity, now: datetime.datetime) -> EtcdCredentials:
    """Read the TLS files ``security`` names; a client certificate must be valid
    at ``now`` (the password file is read at each authentication)."""
    ca = _read_pem(ENV_CACERT, security.ca_file, "CA certificate") if security.ca_file else None
    cert = key = None
    if security.cert_file:
        cert = _read_pem(ENV_CERT, security.cert_file, "client certificate")
        key = _read_pem(ENV_KEY, security.key_file, "client key")
        check_validity(cert, now, f"{ENV_CERT}={security.cert_file}")
    return EtcdCredentials(security.tls, ca, key, cert)


def read_password(security: EtcdSecurity) -> str:
    """The password in ``security``'s file (empty without one). Read again at
    every authentication, so a rotated Secret is picked up without a restart."""
    if not security.password_file:
        return ""
    raw = _read(ENV_PASSWORD_FILE, security.password_file, "password file")
    return raw.decode("utf-8", errors="replace").rstrip("\r\n")


def check_validity(pem: bytes, now: datetime.datetime, where: str) -> None:
    """PermissionDenied if the first certificate in ``pem`` is expired or not yet
    valid at ``now``; InvalidArgument if it cannot be decoded."""
    not_before, not_after = certificate_validity(pem, where)
    if now > not_after:
        raise errors.PermissionDenied(
            f"the etcd client certificate {where} expired at {not_after.isoformat()}: renew it"
        )
    if now < not_before:
        raise errors.PermissionDenied(
            f"the etcd client certificate {where} is valid only from {not_before.isoformat()}"
        )


# -- the validity period of an X.509 certificate, from its DER -----------------

_SEQUENCE = 0x30
_UTC_TIME = 0x17
_GENERALIZED_TIME = 0x18
_EXPLICIT_VERSION = 0xA0


def _tlv(der: bytes, offset: int) -> tuple[int, int, int]:
    """Tag, content start and content end of the DER element at ``offset``."""
    tag = der[offset]
    length = der[offset + 1]
    start = offset + 2
    if length & 0x80:
        count = length & 0x7F
        length = int.from_bytes(der[start : start + count], "big")
        start += count
    end = start + length
    if end > len(der):
        raise ValueError("truncated DER element")
    return tag, start, end


def _time(tag: int, text: str) -> datetime.datetime:
    if tag == _UTC_TIME:
        parsed = datetime.datetime.strptime(text, "%y%m%d%H%M%SZ")
    elif tag == _GENERALIZED_TIME:
        parsed = datetime.datetime.strptime(text, "%Y%m%d%H%M%SZ")
    else:
        raise ValueError(f"unexpected time tag {tag:#x}")
    return parsed.replace(tzinfo=datetime.UTC)


def certificate_validity(pem: bytes, where: str) -> tuple[datetime.datetime, datetime.datetime]:
    """``(not_before, not_after)`` of the first certificate in ``pem`` (pure)."""
    text = pem.decode("ascii", errors="replace")
    begin = text.find("-----BEGIN CERTIFICATE-----")
    end = text.find("-----END CERTIFICATE-----", begin)
    if begin < 0 or end < 0:
        raise errors.InvalidArgument(
            f"the etcd client certificate {where} has no CERTIFICATE block"
        )
    try:
        body = text[begin + len("-----BEGIN CERTIFICATE-----") : end]
        der = base64.b64decode("".join(body.split()), validate=True)
        _, cert_start, _ = _tlv(der, 0)
        tag, tbs_start, _ = _tlv(der, cert_start)
        if tag != _SEQUENCE:
            raise ValueError("no tbsCertificate")
        offset = tbs_start
        if der[offset] == _EXPLICIT_VERSION:
            offset = _tlv(der, offset)[2]
        for _ in range(3):  # serialNumber, signature, issuer
            offset = _tlv(der, offset)[2]
        tag, validity_start, _ = _tlv(der, offset)
        if tag != _SEQUENCE:
            raise ValueError("no validity")
        before_tag, before_start, before_end = _tlv(der, validity_start)
        after_tag, after_start, after_end = _tlv(der, before_end)
        return (
            _time(before_tag, der[before_start:before_end].decode("ascii")),
            _time(after_tag, der[after_start:after_end].decode("ascii")),
        )
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        raise errors.InvalidArgument(
            f"the etcd client certificate {where} cannot be decoded: {exc}"
        ) from None
