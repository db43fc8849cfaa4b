"""A real Pulsar standalone (broker + bookie + RocksDB metadata) for tests, on loopback.

``ensure_pulsar_jars()`` fetches ``org.apache.pulsar:pulsar-broker`` and its
dependencies from Maven Central once (``scripts/testbed/pulsar/pom.xml``) into
``<cache>/pulsar-<version>/libs``. ``start_pulsar(data_dir)`` writes its own
``standalone.conf`` (free 127.0.0.1 ports, no functions worker, no stream
storage, small caches), runs ``org.apache.pulsar.PulsarStandaloneStarter`` and
waits until the admin REST API answers and a topic can be created. Logs go to
``<data_dir>/pulsar.log``.

Command line::

    PYTHONPATH=scripts python -m headrace_testbed.pulsar download        # print libs dir
    PYTHONPATH=scripts python -m headrace_testbed.pulsar run DATA_DIR    # serve until ^C

While it runs, SIGHUP to that process restarts the standalone on the same ports
and data; ``DATA_DIR/testbed.json`` names the JVM's pid (see ``jvm.serve``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from headrace_testbed import TestbedError
from headrace_testbed.jvm import (
    JavaServer,
    ensure_maven_libs,
    java_command,
    launch,
    serve,
    wait_until,
)
from headrace_testbed.ports import LOOPBACK, free_ports

PULSAR_VERSION = os.environ.get("HEADRACE_PULSAR_VERSION", "4.0.7")
HEAP = os.environ.get("HEADRACE_PULSAR_HEAP", "768m")
START_TIMEOUT_S = 180.0
_START_ATTEMPTS = 3
_PROBE_TOPIC = "headrace-testbed-probe"
_JAVA_OPENS = [
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/sun.net=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports=java.base/jdk.internal.platform=ALL-UNNAMED",
    "--add-opens=java.management/sun.management=ALL-UNNAMED",
    "--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-XX:MaxDirectMemorySize=512m",
]
_LOG4J2 = """status = warn
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{ISO8601} [%t] %-5level %logger{36} - %msg%n
rootLogger.level = info
rootLogger.appenderRef.console.ref = console
logger.bk.name = org.apache.bookkeeper
logger.bk.level = warn
logger.zk.name = org.apache.zookeeper
logger.zk.level = warn
"""


def ensure_pulsar_jars(version: str = PULSAR_VERSION) -> Path:
    """The directory of the standalone's jars, downloaded on first use."""
    return ensure_maven_libs("pulsar", version, "pulsar.version")


def standalone_conf(broker_port: int, web_port: int) -> str:
    """The standalone's configuration (pure); bookie settings share the file."""
    settings = {
        "clusterName": "standalone",
        "bindAddress": LOOPBACK,
        "advertisedAddress": LOOPBACK,
        "brokerServicePort": str(broker_port),
        "webServicePort": str(web_port),
        "functionsWorkerEnabled": "false",
        "systemTopicEnabled": "true",
        "topicLevelPoliciesEnabled": "true",
        "allowAutoTopicCreation": "true",
        "allowAutoTopicCreationType": "non-partitioned",
        "brokerDeleteInactiveTopicsEnabled": "false",
        # The WAL needs it: a record the client resends is stored once (docs/backends.md).
        "brokerDeduplicationEnabled": "true",
        "managedLedgerDefaultEnsembleSize": "1",
        "managedLedgerDefaultWriteQuorum": "1",
        "managedLedgerDefaultAckQuorum": "1",
        "managedLedgerCacheSizeMB": "32",
        "managedLedgerMaxEntriesPerLedger": "50000",
        "managedLedgerMinLedgerRolloverTimeMinutes": "0",
        "defaultRetentionTimeInMinutes": "0",
        "defaultRetentionSizeInMB": "0",
        "ttlDurationDefaultInSeconds": "0",
        "maxMessageSize": str(9 * 1024 * 1024),
        "nettyMaxFrameSizeBytes": str(9 * 1024 * 1024 + 10 * 1024),
        "numIOThreads": "2",
        "numHttpServerThreads": "4",
        "webSocketServiceEnabled": "false",
        "authenticationEnabled": "false",
        "authorizationEnabled": "false",
        # Bookie (the standalone reads the same file for its local bookie).
        "journalSyncData": "false",
        "dbStorage_writeCacheMaxSizeMb": "16",
        "dbStorage_readAheadCacheMaxSizeMb": "16",
        "dbStorage_rocksDB_blockCacheSize": "16777216",
        "httpServerEnabled": "false",
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


@dataclasses.dataclass
class PulsarStandalone:
    server: JavaServer
    broker_port: int
    web_port: int
    startup_seconds: float

    @property
    def service_url(self) -> str:
        """``pulsar://127.0.0.1:<port>``."""
        return f"pulsar://{LOOPBACK}:{self.broker_port}"

    @property
    def admin_url(self) -> str:
        """``http://127.0.0.1:<web port>``."""
        return f"http://{LOOPBACK}:{self.web_port}"

    def stop(self) -> None:
        self.server.stop()

    def restart(self) -> None:
        """Stop the server and start it again on the same ports and data; wait
        until it serves."""
        self.startup_seconds = self.server.relaunch(
            functools.partial(_serving, self.admin_url), START_TIMEOUT_S
        )

    def __enter__(self) -> PulsarStandalone:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _request(url: str, method: str = "GET") -> int:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5.0) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, urllib.error.URLError):
        return 0


def _serving(admin_url: str) -> bool:
    request = urllib.request.Request(f"{admin_url}/admin/v2/clusters")
    try:
        with urllib.request.urlopen(request, timeout=2.0) as response:
            clusters = json.loads(response.read() or b"[]")
    except (OSError, urllib.error.URLError, ValueError):
        return False
    if "standalone" not in clusters:
        return False
    topic = f"{admin_url}/admin/v2/persistent/public/default/{_PROBE_TOPIC}"
    return _request(topic, "PUT") in (204, 409) and _request(f"{topic}/internalStats") == 200


def start_pulsar(data_dir: Path) -> PulsarStandalone:
    """Start a standalone with its data under ``data_dir``; wait until it serves."""
    libs = ensure_pulsar_jars()
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "log4j2.properties").write_text(_LOG4J2)
    last_error: TestbedError | None = None
    for _ in range(_START_ATTEMPTS):
        began = time.monotonic()
        broker_port, web_port, bookie_port = free_ports(3)
        config = data_dir / "standalone.conf"
        config.write_text(standalone_conf(broker_port, web_port))
        command = java_command(
            libs,
            HEAP,
            "org.apache.pulsar.PulsarStandaloneStarter",
            [
                "--config",
                str(config),
                "--no-functions-worker",
                "--no-stream-storage",
                f"--advertised-address={LOOPBACK}",
                f"--bookkeeper-port={bookie_port}",
                f"--bookkeeper-dir={data_dir / 'bookkeeper'}",
                f"--metadata-dir={data_dir / 'metadata'}",
            ],
        )
        command[1:1] = [
            *_JAVA_OPENS,
            f"-Dlog4j2.configurationFile={data_dir / 'log4j2.properties'}",
            f"-Dpulsar.log.dir={data_dir}",
        ]
        server = launch("pulsar standalone", command, data_dir, "pulsar.log")
        admin_url = f"http://{LOOPBACK}:{web_port}"
        try:
            wait_until(server, functools.partial(_serving, admin_url), START_TIMEOUT_S, "serving")
        except TestbedError as exc:
            last_error = exc
            if "Address already in use" not in str(exc):
                break
            continue
        return PulsarStandalone(server, broker_port, web_port, time.monotonic() - began)
    assert last_error is not None
    raise last_error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("download", help="fetch (or reuse) the standalone's jars; print their dir")
    run = commands.add_parser("run", help="run a standalone on free loopback ports until ^C")
    run.add_argument("data_dir", type=Path)
    args = parser.parse_args(argv)
    if args.command == "download":
        began = time.monotonic()
        print(ensure_pulsar_jars(), f"({time.monotonic() - began:.1f} s)")
        return 0
    with start_pulsar(args.data_dir) as standalone:
        print(
            standalone.service_url,
            standalone.admin_url,
            f"(started in {standalone.startup_seconds:.1f} s)",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            serve(standalone.server, standalone.restart, standalone.service_url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
