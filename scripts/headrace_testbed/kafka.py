"""A real single-node Kafka broker (KRaft) for tests, on loopback.

``ensure_kafka_jars()`` fetches the broker's jars from Maven Central once
(``scripts/testbed/kafka/pom.xml``) into
``<cache>/kafka-<version>/libs``. ``start_kafka(data_dir)`` writes a combined
broker+controller ``server.properties`` on free 127.0.0.1 ports, formats the
storage, starts ``kafka.Kafka`` and waits until the broker answers a metadata
request and can create a topic. Logs go to ``<data_dir>/kafka.log``.

Command line::

    PYTHONPATH=scripts python -m headrace_testbed.kafka download        # print libs dir
    PYTHONPATH=scripts python -m headrace_testbed.kafka run DATA_DIR    # serve until ^C

While it runs, SIGHUP to that process restarts the broker on the same ports and
data; ``DATA_DIR/testbed.json`` names the JVM's pid (see ``jvm.serve``).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import functools
import os
import subprocess
import sys
import time
import uuid
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

KAFKA_VERSION = os.environ.get("HEADRACE_KAFKA_VERSION", "4.1.1")
HEAP = os.environ.get("HEADRACE_KAFKA_HEAP", "512m")
START_TIMEOUT_S = 120.0
_START_ATTEMPTS = 3
_PROBE_TOPIC = "headrace-testbed-probe"

_LOG4J2 = """status = warn
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.console.ref = console
logger.kafka.name = kafka
logger.kafka.level = info
logger.state.name = state.change.logger
logger.state.level = warn
"""


def ensure_kafka_jars(version: str = KAFKA_VERSION) -> Path:
    """The directory of the broker's jars, downloaded on first use."""
    return ensure_maven_libs("kafka", version, "kafka.version")


def server_properties(data_dir: Path, broker_port: int, controller_port: int) -> str:
    """A single-node combined broker+controller configuration (pure)."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{LOOPBACK}:{controller_port}",
        "listeners": f"PLAINTEXT://{LOOPBACK}:{broker_port},CONTROLLER://{LOOPBACK}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{broker_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir / "kraft-logs"),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "2",
        "log.segment.bytes": str(64 * 1024 * 1024),
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def _cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


_STORAGE_TOOLS = ("kafka.tools.StorageTool", "org.apache.kafka.tools.StorageTool")
"""Where the storage tool lives: in the broker jar up to 4.x, in kafka-tools later."""


def _format_storage(libs: Path, data_dir: Path, config: Path) -> None:
    args = ["format", "--cluster-id", _cluster_id(), "-c", str(config), "--ignore-formatted"]
    output = ""
    for main_class in _STORAGE_TOOLS:
        command = java_command(libs, "256m", main_class, args)
        result = subprocess.run(
            command, cwd=data_dir, capture_output=True, text=True, timeout=120, check=False
        )
        if result.returncode == 0:
            return
        output = result.stdout + result.stderr
        if "Could not find or load main class" not in output:
            break
    raise TestbedError(f"formatting Kafka storage in {data_dir} failed:\n{output[-4000:]}")


@dataclasses.dataclass
class KafkaBroker:
    server: JavaServer
    port: int
    startup_seconds: float

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:<port>``, the bootstrap.servers value."""
        return f"{LOOPBACK}:{self.port}"

    def stop(self) -> None:
        self.server.stop()

    def restart(self) -> None:
        """Stop the server and start it again on the same ports and data; wait
        until it serves."""
        self.startup_seconds = self.server.relaunch(
            functools.partial(_answers_metadata, self.bootstrap), START_TIMEOUT_S
        )

    def __enter__(self) -> KafkaBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _answers_metadata(bootstrap: str) -> bool:
    from confluent_kafka import KafkaException  # noqa: PLC0415
    from confluent_kafka.admin import AdminClient, NewTopic  # noqa: PLC0415

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        metadata = admin.list_topics(timeout=2.0)
        if not metadata.brokers:
            return False
        if _PROBE_TOPIC in metadata.topics:
            return True
        futures = admin.create_topics([NewTopic(_PROBE_TOPIC, 1, 1)], operation_timeout=5.0)
        futures[_PROBE_TOPIC].result(timeout=10.0)
        return True
    except KafkaException:
        return False


def start_kafka(data_dir: Path) -> KafkaBroker:
    """Start a broker with its data under ``data_dir``; wait until it serves."""
    libs = ensure_kafka_jars()
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "log4j2.properties").write_text(_LOG4J2)
    last_error: TestbedError | None = None
    for _ in range(_START_ATTEMPTS):
        began = time.monotonic()
        broker_port, controller_port = free_ports(2)
        config = data_dir / "server.properties"
        config.write_text(server_properties(data_dir, broker_port, controller_port))
        _format_storage(libs, data_dir, config)
        command = java_command(libs, HEAP, "kafka.Kafka", [str(config)])
        command[1:1] = [
            f"-Dlog4j2.configurationFile={data_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={data_dir}",
        ]
        server = launch("kafka", command, data_dir, "kafka.log")
        bootstrap = f"{LOOPBACK}:{broker_port}"
        try:
            wait_until(
                server, functools.partial(_answers_metadata, bootstrap), START_TIMEOUT_S, "serving"
            )
        except TestbedError as exc:
            last_error = exc
            if "Address already in use" not in str(exc):
                break
            continue
        return KafkaBroker(server, broker_port, time.monotonic() - began)
    assert last_error is not None
    raise last_error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("download", help="fetch (or reuse) the broker jars; print their dir")
    run = commands.add_parser("run", help="run a broker on free loopback ports until ^C")
    run.add_argument("data_dir", type=Path)
    args = parser.parse_args(argv)
    if args.command == "download":
        began = time.monotonic()
        print(ensure_kafka_jars(), f"({time.monotonic() - began:.1f} s)")
        return 0
    with start_kafka(args.data_dir) as broker:
        print(broker.bootstrap, f"(started in {broker.startup_seconds:.1f} s)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            serve(broker.server, broker.restart, broker.bootstrap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
