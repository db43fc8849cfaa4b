"""Certificates and keys for the test bed (``cryptography`` package).

For Kubernetes (:func:`write_pki`), one throw-away CA signs the API server's
serving certificate (for ``127.0.0.1`` and ``localhost`` plus the first
service IP) and an admin client
certificate in ``system:masters``; a separate key pair signs service-account
tokens. For etcd with TLS (:func:`write_etcd_pki`), a CA signs a serving
certificate for loopback, a client certificate, an expired client certificate,
and a second CA that etcd does not trust signs a stranger's client certificate.
Keys are ECDSA P-256: quick to make and accepted by every component.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from headrace_testbed import TestbedError

VALIDITY = datetime.timedelta(days=30)
ADMIN_USER = "headrace-admin"
ADMIN_GROUP = "system:masters"


@dataclasses.dataclass(frozen=True)
class Pki:
    """Paths of the PEM files written by :func:`write_pki`."""

    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name

    @property
    def ca_cert(self) -> Path:
        return self.path("ca.crt")

    @property
    def ca_key(self) -> Path:
        return self.path("ca.key")

    @property
    def serving_cert(self) -> Path:
        return self.path("apiserver.crt")

    @property
    def serving_key(self) -> Path:
        return self.path("apiserver.key")

    @property
    def admin_cert(self) -> Path:
        return self.path("admin.crt")

    @property
    def admin_key(self) -> Path:
        return self.path("admin.key")

    @property
    def service_account_key(self) -> Path:
        return self.path("sa.key")

    @property
    def service_account_pub(self) -> Path:
        return self.path("sa.pub")


@dataclasses.dataclass(frozen=True)
class _Identity:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    expired: bool = False,
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    start = now - (VALIDITY if expired else datetime.timedelta(minutes=5))
    end = now - datetime.timedelta(days=1) if expired else now + VALIDITY
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
    )


def _make_ca(common_name: str) -> _Identity:
    key = _new_key()
    name = _name(common_name)
    cert = (
        _builder(name, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _Identity(key, cert)


def _issue(
    ca: _Identity,
    subject: x509.Name,
    *,
    server: bool,
    dns_names: tuple[str, ...] = (),
    ip_addresses: tuple[str, ...] = (),
    expired: bool = False,
) -> _Identity:
    key = _new_key()
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        _builder(subject, ca.cert.subject, key, expired)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    alt_names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    return _Identity(key, builder.sign(ca.key, hashes.SHA256()))


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, private: bool) -> None:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)


def _write_identity_at(directory: Path, stem: str, identity: _Identity) -> None:
    cert_pem = identity.cert.public_bytes(serialization.Encoding.PEM)
    _write(directory / f"{stem}.crt", cert_pem, False)
    _write(directory / f"{stem}.key", _key_pem(identity.key), True)


def _write_identity(pki: Pki, stem: str, identity: _Identity) -> None:
    _write_identity_at(pki.directory, stem, identity)


def write_pki(directory: Path, *, service_ip: str = "10.0.0.1") -> Pki:
    """Create every certificate and key the control plane needs under ``directory``."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        pki = Pki(directory)
        ca = _make_ca("headrace-testbed-ca")
        serving = _issue(
            ca,
            _name("kube-apiserver"),
            server=True,
            dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            ip_addresses=("127.0.0.1", service_ip),
        )
        admin = _issue(ca, _name(ADMIN_USER, (ADMIN_GROUP,)), server=False)
        _write_identity(pki, "ca", ca)
        _write_identity(pki, "apiserver", serving)
        _write_identity(pki, "admin", admin)
        signer = _new_key()
        _write(pki.service_account_key, _key_pem(signer), True)
        _write(
            pki.service_account_pub,
            signer.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
            False,
        )
    except OSError as exc:
        raise TestbedError(f"cannot write test certificates under {directory}: {exc}") from exc
    return pki


@dataclasses.dataclass(frozen=True)
class EtcdPki:
    """Paths of the PEM files written by :func:`write_etcd_pki` (``<stem>.crt``
    and ``<stem>.key`` for each identity)."""

    directory: Path

    def cert(self, stem: str) -> Path:
        return self.directory / f"{stem}.crt"

    def key(self, stem: str) -> Path:
        return self.directory / f"{stem}.key"

    @property
    def ca_cert(self) -> Path:
        """The CA etcd trusts, which signed every identity but the stranger's."""
        return self.cert("ca")

    @property
    def other_ca_cert(self) -> Path:
        """A CA that signed nothing etcd serves: a client trusting it fails the handshake."""
        return self.cert("other-ca")


ETCD_CLIENT = "client"
"""Stem of the valid client identity (its common name is :data:`ETCD_CLIENT_CN`)."""
ETCD_CLIENT_CN = "headrace"
ETCD_EXPIRED_CLIENT = "expired-client"
ETCD_STRANGER = "stranger"
"""A client identity signed by the other CA."""
SERVER_NEXT = "server-next"
"""A second serving identity from the same CA: what a rotation installs."""
ETCD_NOBODY = "nobody"
"""A valid client identity whose common name is no etcd user."""


def write_etcd_pki(directory: Path) -> EtcdPki:
    """A CA, etcd's serving identity (``server``, for 127.0.0.1 and localhost) and
    client identities: valid, expired, one signed by an untrusted CA, and one
    whose common name is no user."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        pki = EtcdPki(directory)
        ca = _make_ca("headrace-etcd-ca")
        other = _make_ca("headrace-untrusted-ca")
        identities = {
            "ca": ca,
            "other-ca": other,
            "server": _issue(
                ca,
                _name("etcd"),
                server=True,
                dns_names=("localhost",),
                ip_addresses=("127.0.0.1",),
            ),
            SERVER_NEXT: _issue(
                ca,
                _name("etcd-next"),
                server=True,
                dns_names=("localhost",),
                ip_addresses=("127.0.0.1",),
            ),
            ETCD_CLIENT: _issue(ca, _name(ETCD_CLIENT_CN), server=False),
            ETCD_EXPIRED_CLIENT: _issue(ca, _name(ETCD_CLIENT_CN), server=False, expired=True),
            ETCD_STRANGER: _issue(other, _name(ETCD_CLIENT_CN), server=False),
            ETCD_NOBODY: _issue(ca, _name(ETCD_NOBODY), server=False),
        }
        for stem, identity in identities.items():
            _write_identity_at(directory, stem, identity)
    except OSError as exc:
        raise TestbedError(f"cannot write etcd test certificates under {directory}: {exc}") from exc
    return pki
