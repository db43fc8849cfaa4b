"""Throw-away certificates for ``headrace bench node --tls``, made with the
``openssl`` command (a CA, a serving certificate for 127.0.0.1, a client one)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

from headrace import errors


@dataclasses.dataclass(frozen=True)
class BenchCerts:
    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise errors.HeadraceError(f"openssl {args[0]} failed: {result.stderr.strip()[-500:]}")


def _issue(directory: Path, stem: str, subject: str, extensions: str) -> None:
    _openssl(
        "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{stem}.key", cwd=directory
    )
    _openssl(
        "req", "-new", "-key", f"{stem}.key", "-subj", subject, "-out", f"{stem}.csr", cwd=directory
    )
    (directory / f"{stem}.ext").write_text(extensions)
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{stem}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        f"{stem}.ext",
        "-out",
        f"{stem}.crt",
        cwd=directory,
    )


def make_certs(directory: Path) -> BenchCerts:
    """A CA (``ca.crt``), ``server.crt/key`` for 127.0.0.1 and ``client.crt/key``."""
    if shutil.which("openssl") is None:
        raise errors.Unavailable("bench node --tls makes its certificates with openssl: not found")
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key", cwd=directory)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        "ca.key",
        "-subj",
        "/CN=headrace-bench-ca",
        "-days",
        "2",
        "-out",
        "ca.crt",
        cwd=directory,
    )
    _issue(
        directory,
        "server",
        "/CN=127.0.0.1",
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    _issue(directory, "client", "/CN=bench-client", "extendedKeyUsage=clientAuth\n")
    return BenchCerts(directory)
