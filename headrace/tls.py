"""TLS of the nodes' gRPC servers and of the clients that call them.

Server side (:class:`ServerTLS`): a certificate and key, and optionally the CA
whose client certificates it requires (mutual TLS). The files are checked when
the node starts (a clear error naming the file and what is wrong) and read
again whenever one of them changes: gRPC asks for the configuration at each new
handshake, so rotated certificates apply to new connections while open
streams go on. A rotated pair that does not load is logged and the previous
one kept.

Client side (:class:`ClientTLS`): the CA to trust, the client's own
certificate and key for mutual TLS, and the name to check the nodes'
certificates against (nodes advertise IP addresses); a bearer token (:class:`TokenFile`) goes
with every call as ``authorization`` metadata, read again when its file
changes, and only over TLS (gRPC refuses call credentials on plaintext).

Certificates and keys are PEM files; paths may be given as flags, tokens only
in files (never on the command line).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import ssl
from pathlib import Path

import grpc

from headrace import errors
from headrace.cluster import TLSMode

log = logging.getLogger(__name__)

ENV_CA = "HEADRACE_TLS_CA"
ENV_CERT = "HEADRACE_TLS_CERT"
ENV_KEY = "HEADRACE_TLS_KEY"
ENV_TOKEN_FILE = "HEADRACE_TOKEN_FILE"
ENV_SERVER_NAME = "HEADRACE_TLS_SERVER_NAME"


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise errors.InvalidArgument(f"cannot read the {what} {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise errors.InvalidArgument(f"the {what} {path} is not a PEM file")
    return data


def check_pair(cert: Path, key: Path) -> None:
    """InvalidArgument unless ``cert`` and ``key`` are a matching PEM pair."""
    _read(cert, "certificate")
    _read(key, "private key")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise errors.InvalidArgument(
            f"the certificate {cert} and key {key} do not load as a pair: {exc.reason or exc}"
        ) from None


def check_ca(ca: Path) -> None:
    _read(ca, "CA certificate")
    try:
        ssl.create_default_context(cafile=str(ca))
    except ssl.SSLError as exc:
        raise errors.InvalidArgument(
            f"the CA certificate {ca} does not load: {exc.reason or exc}"
        ) from None


def _stamp(paths: tuple[Path, ...]) -> tuple[tuple[int, int], ...]:
    """(mtime_ns, size) of each file; (-1, -1) for one that cannot be read."""
    stamps = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            stamps.append((-1, -1))
        else:
            stamps.append((st.st_mtime_ns, st.st_size))
    return tuple(stamps)


@dataclasses.dataclass(frozen=True)
class ServerTLS:
    cert: Path
    key: Path
    client_ca: Path | None = None
    """Require client certificates signed by this CA (mutual TLS)."""

    @property
    def files(self) -> tuple[Path, ...]:
        return (self.cert, self.key) + ((self.client_ca,) if self.client_ca else ())

    @property
    def mode(self) -> TLSMode:
        return TLSMode.MUTUAL if self.client_ca is not None else TLSMode.TLS

    def check(self) -> None:
        check_pair(self.cert, self.key)
        if self.client_ca is not None:
            check_ca(self.client_ca)

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(_read(self.key, "private key"), _read(self.cert, "certificate"))],
            root_certificates=(
                _read(self.client_ca, "CA certificate") if self.client_ca is not None else None
            ),
        )


class ReloadingServerCredentials:
    """Server credentials that follow changes of the files of ``tls``."""

    def __init__(self, tls: ServerTLS) -> None:
        tls.check()
        self.tls = tls
        self._stamp = _stamp(tls.files)
        self.reloads = 0
        self.credentials = grpc.dynamic_ssl_server_credentials(
            tls.configuration(),
            # gRPC documents None as "no change"; the stubs do not allow it.
            self._fetch,  # type: ignore[arg-type]
            require_client_authentication=tls.client_ca is not None,
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC at each handshake: a new configuration when the files
        changed and load, else None (keep the current one)."""
        stamp = _stamp(self.tls.files)
        if stamp == self._stamp:
            return None
        try:
            self.tls.check()
            config = self.tls.configuration()
        except errors.HeadraceError as exc:
            log.warning("TLS files changed but do not load (keeping the previous ones): %s", exc)
            return None
        self._stamp = stamp
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self.tls.cert)
        return config


class TokenFile:
    """A bearer token read from a file, again whenever the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = _stamp((path,))
        self._token = self._load()

    def _load(self) -> str:
        try:
            token = self.path.read_text().strip()
        except (OSError, UnicodeError) as exc:
            raise errors.InvalidArgument(f"cannot read the token file {self.path}: {exc}") from None
        if not token:
            raise errors.InvalidArgument(f"the token file {self.path} is empty")
        return token

    def token(self) -> str:
        stamp = _stamp((self.path,))
        if stamp != self._stamp:
            self._token = self._load()
            self._stamp = stamp
        return self._token


class _BearerToken(grpc.AuthMetadataPlugin):
    def __init__(self, token: TokenFile) -> None:
        self.token_file = token

    def __call__(
        self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback
    ) -> None:
        try:
            token = self.token_file.token()
        except errors.HeadraceError as exc:
            callback((), exc)
            return
        callback((("authorization", f"Bearer {token}"),), None)


@dataclasses.dataclass(frozen=True)
class ClientTLS:
    ca: Path
    cert: Path | None = None
    key: Path | None = None
    token_file: Path | None = None
    server_name: str = ""
    """The name to check nodes' certificates against instead of the address
    they advertise (a pod IP no certificate can name in advance): e.g. the
    DNS name a cert-manager Certificate lists, ``<cluster>-nodes.<ns>.svc``."""

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise errors.InvalidArgument("a client certificate needs its key, and a key its cert")

    def check(self) -> None:
        check_ca(self.ca)
        if self.cert is not None and self.key is not None:
            check_pair(self.cert, self.key)

    def credentials(self) -> grpc.ChannelCredentials:
        self.check()
        channel = grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "CA certificate"),
            private_key=_read(self.key, "private key") if self.key else None,
            certificate_chain=_read(self.cert, "certificate") if self.cert else None,
        )
        if self.token_file is None:
            return channel
        call = grpc.metadata_call_credentials(_BearerToken(TokenFile(self.token_file)))
        return grpc.composite_channel_credentials(channel, call)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ClientTLS | None:
        """From ``HEADRACE_TLS_CA`` (and ``_CERT``, ``_KEY``, ``HEADRACE_TOKEN_FILE``);
        None without a CA."""
        env = dict(os.environ) if environ is None else environ
        ca = env.get(ENV_CA, "")
        if not ca:
            if env.get(ENV_TOKEN_FILE):
                raise errors.InvalidArgument(
                    f"{ENV_TOKEN_FILE} needs TLS: set {ENV_CA} too (tokens never go in plaintext)"
                )
            return None
        cert, key, token = env.get(ENV_CERT, ""), env.get(ENV_KEY, ""), env.get(ENV_TOKEN_FILE, "")
        return cls(
            Path(ca),
            Path(cert) if cert else None,
            Path(key) if key else None,
            Path(token) if token else None,
            env.get(ENV_SERVER_NAME, ""),
        )

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
