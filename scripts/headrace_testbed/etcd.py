"""A real etcd server for tests: built from source once, run on loopback.

``ensure_etcd()`` builds the wrapper module in ``scripts/testbed/etcd`` (a
``main`` calling ``etcdmain.Main``) with ``go build`` into
``<cache>/bin/etcd-<version>``; the version is the one ``go.mod`` requires.
Concurrent builders (several pytest processes) serialise on a file lock and
reuse the first result. ``start_etcd(data_dir)`` runs a single-member cluster
on free 127.0.0.1 ports and waits until ``/health`` answers;
``start_etcd(data_dir, secure=True)`` serves TLS only, requires client
certificates and has authentication on (:mod:`headrace_testbed.etcd_auth`).

Command line::

    PYTHONPATH=scripts python -m headrace_testbed.etcd build        # print the path
    PYTHONPATH=scripts python -m headrace_testbed.etcd run DATA_DIR  # serve until ^C
    PYTHONPATH=scripts python -m headrace_testbed.etcd run --secure DATA_DIR
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from headrace_testbed import TestbedError, etcd_auth, gobuild
from headrace_testbed.cache import bin_dir, file_lock
from headrace_testbed.ports import LOOPBACK, free_ports
from headrace_testbed.process import (
    StartOptions,
    StopOnExit,
    log_tail,
    start_server,
    stop_process,
)

SOURCE_DIR = Path(__file__).resolve().parents[1] / "testbed" / "etcd"
BUILD_TIMEOUT_S = 1800.0
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
_START_ATTEMPTS = 3


def etcd_version(source_dir: Path = SOURCE_DIR) -> str:
    """The etcd server version the wrapper module requires, e.g. ``v3.6.16``."""
    return gobuild.required_version(source_dir, "go.etcd.io/etcd/server/v3")


def _build(target: Path, source_dir: Path) -> None:
    go = gobuild.go_binary(
        "it is needed once to build the etcd test server; install Go >= 1.24, "
        "or deselect the real-etcd tests with -m 'not etcd'"
    )
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    env = dict(os.environ, GOFLAGS="-mod=mod", CGO_ENABLED="0")
    command = [go, "build", "-trimpath", "-o", str(partial), "."]
    try:
        result = subprocess.run(
            command,
            cwd=source_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        partial.unlink(missing_ok=True)
        raise TestbedError(f"building etcd took more than {BUILD_TIMEOUT_S:.0f} s") from exc
    if result.returncode != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        tail = (result.stderr or result.stdout)[-4000:]
        raise TestbedError(
            f"`{' '.join(command)}` in {source_dir} failed (exit {result.returncode}):\n{tail}"
        )
    partial.chmod(0o755)
    os.replace(partial, target)


def ensure_etcd(source_dir: Path = SOURCE_DIR) -> Path:
    """Path of the cached etcd binary, building it first if it is missing."""
    override = os.environ.get("HEADRACE_ETCD_BIN")
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise TestbedError(f"HEADRACE_ETCD_BIN={override} is not an executable file")
        return path
    target = bin_dir() / f"etcd-{etcd_version(source_dir)}"
    if os.access(target, os.X_OK):
        return target
    with file_lock(target.with_name(f"{target.name}.lock")):
        if not os.access(target, os.X_OK):
            _build(target, source_dir)
    return target


@dataclasses.dataclass
class EtcdServer(StopOnExit):
    """A running single-member etcd; stop it with :meth:`stop` or ``with``."""

    process: subprocess.Popen[bytes]
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    auth: etcd_auth.EtcdAuth | None = None
    """Set in the secure mode: TLS with client certificates, authentication on."""

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:<client port>``."""
        return f"{LOOPBACK}:{self.client_port}"

    @property
    def url(self) -> str:
        """The metastore URL: ``etcd://127.0.0.1:<port>``, ``etcds://`` in the secure mode."""
        return f"{'etcds' if self.auth else 'etcd'}://{self.endpoint}"

    def stop(self) -> None:
        stop_process(self.process, STOP_TIMEOUT_S)

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), like a crash."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)

    def log_tail(self, limit: int = 4000) -> str:
        return log_tail(self.log_path, limit)


def _healthy(server: EtcdServer) -> bool:
    scheme = "https" if server.auth else "http"
    url = f"{scheme}://{LOOPBACK}:{server.client_port}/health"
    context: ssl.SSLContext | None = server.auth.ssl_context() if server.auth else None
    try:
        with urllib.request.urlopen(url, timeout=1.0, context=context) as response:
            body = json.loads(response.read() or b"{}")
    except (OSError, urllib.error.URLError, ValueError):
        return False
    return str(body.get("health")) == "true"


def _launch(
    binary: Path, data_dir: Path, fsync: bool, auth: etcd_auth.EtcdAuth | None
) -> EtcdServer:
    client_port, peer_port = free_ports(2)
    client_url = f"{'https' if auth else 'http'}://{LOOPBACK}:{client_port}"
    peer_url = f"http://{LOOPBACK}:{peer_port}"
    command = [
        str(binary),
        "--name=headrace-test",
        f"--data-dir={data_dir / 'member-data'}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=headrace-test={peer_url}",
        "--initial-cluster-state=new",
        # Short raft timings make the minimum lease TTL 1 s, so lease tests are quick.
        "--heartbeat-interval=50",
        "--election-timeout=500",
        "--log-level=warn",
    ]
    if not fsync:
        command.append("--unsafe-no-fsync")
    if auth:
        command += etcd_auth.server_flags(auth)
    log_path = data_dir / "etcd.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    return EtcdServer(process, client_port, peer_port, data_dir, log_path, auth)


def start_etcd(data_dir: Path, *, fsync: bool = False, secure: bool = False) -> EtcdServer:
    """Start etcd with its data under ``data_dir`` and wait until it is healthy.

    ``fsync=False`` (the default for tests) runs with ``--unsafe-no-fsync``.
    ``secure=True``: certificates under ``data_dir/pki``, TLS only, client
    certificates required, then authentication enabled (see
    :mod:`headrace_testbed.etcd_auth` for the users).
    """
    binary = ensure_etcd()
    data_dir.mkdir(parents=True, exist_ok=True)
    auth = etcd_auth.prepare(data_dir / "pki") if secure else None
    server = start_server(
        lambda: _launch(binary, data_dir, fsync, auth),
        _healthy,
        f"etcd in {data_dir} did not become healthy",
        StartOptions(attempts=_START_ATTEMPTS, timeout_s=START_TIMEOUT_S, poll_s=0.05),
    )
    if auth:
        try:
            etcd_auth.enable_auth(auth, server.endpoint)
        except BaseException:
            server.stop()
            raise
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build (or reuse) the cached etcd binary; print its path")
    run = commands.add_parser("run", help="run etcd on free loopback ports until interrupted")
    run.add_argument("data_dir", type=Path)
    run.add_argument(
        "--secure", action="store_true", help="TLS with client certificates, authentication on"
    )
    args = parser.parse_args(argv)
    if args.command == "build":
        print(ensure_etcd())
        return 0
    with start_etcd(args.data_dir, fsync=True, secure=args.secure) as server:
        print(server.url, flush=True)
        if server.auth:
            print(f"certificates and password files in {server.auth.pki.directory}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
