"""Java servers of the test bed: jars from Maven Central, one JVM process each.

``ensure_maven_libs`` copies the dependencies of a pom in ``scripts/testbed/``
into ``<cache>/<name>-<version>/libs`` once, with ``mvn -q
dependency:copy-dependencies``; concurrent callers serialise on a file lock and
reuse the first result. Maven resolves every repository through Maven Central
(a mirror in a generated settings file), because some broker poms name other
repositories that this machine cannot reach.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from headrace_testbed import TestbedError
from headrace_testbed.cache import cache_dir, file_lock
from headrace_testbed.process import StopOnExit, log_tail, stop_process

TESTBED_DIR = Path(__file__).resolve().parents[1] / "testbed"
DOWNLOAD_TIMEOUT_S = 1800.0
STOP_TIMEOUT_S = 30.0
_CENTRAL = "https://repo.maven.apache.org/maven2"
_SETTINGS = f"""<settings>
  <mirrors>
    <mirror>
      <id>headrace-central-only</id>
      <mirrorOf>*</mirrorOf>
      <url>{_CENTRAL}</url>
    </mirror>
  </mirrors>
</settings>
"""


def require_tool(name: str, purpose: str) -> str:
    """Path of the executable ``name``, or a TestbedError saying what needs it."""
    found = shutil.which(name)
    if found is None:
        raise TestbedError(
            f"`{name}` is not installed (not on PATH): it is needed for {purpose}; "
            "install a JDK >= 17 and Maven (Debian: apt-get install openjdk-17-jdk-headless maven)"
        )
    return found


def ensure_maven_libs(name: str, version: str, version_property: str) -> Path:
    """``<cache>/<name>-<version>/libs`` filled from ``scripts/testbed/<name>/pom.xml``."""
    home = cache_dir() / f"{name}-{version}"
    libs = home / "libs"
    done = home / ".complete"
    if done.exists():
        return libs
    with file_lock(home / ".lock"):
        if done.exists():
            return libs
        mvn = require_tool("mvn", f"downloading the {name} test broker's jars once")
        settings = home / "maven-settings.xml"
        settings.write_text(_SETTINGS)
        partial = home / f"libs.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        command = [
            mvn,
            "-q",
            "-B",
            "-s",
            str(settings),
            "-f",
            str(TESTBED_DIR / name / "pom.xml"),
            f"-D{version_property}={version}",
            "dependency:copy-dependencies",
            f"-DoutputDirectory={partial}",
        ]
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise TestbedError(
                f"downloading {name} {version} took more than {DOWNLOAD_TIMEOUT_S:.0f} s"
            ) from exc
        if result.returncode != 0 or not partial.is_dir():
            shutil.rmtree(partial, ignore_errors=True)
            tail = (result.stdout + result.stderr)[-4000:]
            raise TestbedError(f"`{' '.join(command)}` failed (exit {result.returncode}):\n{tail}")
        shutil.rmtree(libs, ignore_errors=True)
        os.replace(partial, libs)
        done.write_text(f"{name} {version}\n")
    return libs


@dataclasses.dataclass
class JavaServer(StopOnExit):
    """A JVM started by the test bed; stop it with :meth:`stop` or ``with``."""

    name: str
    process: subprocess.Popen[bytes]
    data_dir: Path
    log_path: Path
    command: tuple[str, ...] = ()
    """What started the process; :meth:`relaunch` runs it again."""

    @property
    def pid(self) -> int:
        return self.process.pid

    def relaunch(self, ready: Callable[[], bool], timeout: float) -> float:
        """Stop the process and start the same command again (same ports, same
        data, log appended); wait until ``ready()``; the seconds it took."""
        began = time.monotonic()
        self.stop()
        self.process = _spawn(self.command, self.data_dir, self.log_path)
        wait_until(self, ready, timeout, "serving after a restart")
        return time.monotonic() - began

    def stop(self) -> None:
        stop_process(self.process, STOP_TIMEOUT_S)

    def log_tail(self, limit: int = 6000) -> str:
        return log_tail(self.log_path, limit)

    def start_failure(self, why: str) -> TestbedError:
        """Stop the process and describe the failure with the log's tail."""
        self.stop()
        return TestbedError(
            f"{self.name} in {self.data_dir} {why}; log {self.log_path} ends with:\n"
            f"{self.log_tail()}"
        )


def java_command(libs: Path, heap: str, main_class: str, args: Sequence[str]) -> list[str]:
    java = require_tool("java", "running the test brokers")
    return [
        java,
        f"-Xms{heap}",
        f"-Xmx{heap}",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-Djava.net.preferIPv4Stack=true",
        "-cp",
        f"{libs}/*",
        main_class,
        *args,
    ]


def launch(name: str, command: Sequence[str], data_dir: Path, log_name: str) -> JavaServer:
    log_path = data_dir / log_name
    process = _spawn(command, data_dir, log_path)
    return JavaServer(name, process, data_dir, log_path, tuple(command))


def _spawn(command: Sequence[str], data_dir: Path, log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, cwd=data_dir)


STATE_FILE = "testbed.json"
"""Written by :func:`serve` into the server's data dir: ``pid`` (the JVM),
``runner`` (the serving process: SIGHUP it to restart the server), ``restarts``
and ``address``. Chaos runs (``headrace bench chaos --broker-faults DIR``) use it
to stall the JVM and to restart it."""


def serve(server: JavaServer, restart: Callable[[], None], address: str) -> None:
    """Serve until ^C or SIGTERM; on SIGHUP ``restart()`` (same ports and data).

    Keeps :data:`STATE_FILE` current; returns when the server exits by itself.
    """
    asked: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        asked.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGHUP, signal.SIGTERM)}
    restarts = 0
    try:
        _write_state(server, address, restarts)
        while True:
            if signal.SIGTERM in asked:
                return
            if signal.SIGHUP in asked:
                asked.clear()
                restart()
                restarts += 1
                _write_state(server, address, restarts)
            try:
                server.process.wait(0.2)
                return
            except subprocess.TimeoutExpired:
                continue
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _write_state(server: JavaServer, address: str, restarts: int) -> None:
    state = {"pid": server.pid, "runner": os.getpid(), "restarts": restarts, "address": address}
    path = server.data_dir / STATE_FILE
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(state) + "\n")
    partial.replace(path)


def wait_until(server: JavaServer, ready: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``ready()`` until it is true; a TestbedError with the log tail if not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise server.start_failure(f"exited with {server.process.returncode} before {what}")
        if ready():
            return
        time.sleep(0.2)
    raise server.start_failure(f"did not get to {what} within {timeout:.0f} s")
