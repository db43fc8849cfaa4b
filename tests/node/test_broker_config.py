"""Kafka and Pulsar flags of ``headrace node`` / ``standalone`` become backend settings.

Unit tests of the pure mapping (:mod:`headrace.cli.walflags`,
:func:`headrace.cli.run.wal_settings`), of what the standalone and the chaos
cluster hand on to node processes, and of the retry/timeout rules a node
applies when a broker is down.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from headrace import errors
from headrace.bench.procs import ClusterSpec, backend_args, node_command
from headrace.cli import walflags
from headrace.cli.main import build_parser
from headrace.cli.run import standalone_config, wal_settings
from headrace.cluster import Assignment, AssignmentState
from headrace.node.assignments import Action, decide, retry_delay
from headrace.node.services import failed_wal_info
from headrace.node.walmanager import next_failure
from headrace.standalone import StandaloneConfig
from headrace.standalone import node_command as standalone_node_command
from headrace.wal.framework import DEFAULT_OPEN_TIMEOUT_S, WALOptions, open_timeout
from headrace.wal.kafka.settings import parse_settings as parse_kafka
from headrace.wal.pulsar.settings import parse_settings as parse_pulsar

BASE = ["node", "--node-id", "n1", "--metastore", "sqlite:///tmp/m.db", "--cluster", "prod"]


def node_args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args([*BASE, *flags])


def settings_of(*flags: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    return wal_settings(node_args(*flags), env or {})


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# ------------------------------------------------------------------ kafka


def test_kafka_flags_become_client_settings(tmp_path: Path) -> None:
    password = write(tmp_path / "pw", "s3cret\n")
    ca = write(tmp_path / "ca.pem", "CA")
    settings = settings_of(
        "--wal",
        "kafka",
        "--kafka-bootstrap",
        "b1:9093,b2:9093",
        "--kafka-sasl-mechanism",
        "SCRAM-SHA-512",
        "--kafka-sasl-username",
        "headrace",
        "--kafka-sasl-password-file",
        password,
        "--kafka-ssl-ca",
        ca,
        "--kafka-config",
        "client.id=wal",
        "--kafka-config",
        "socket.keepalive.enable=true",
        "--kafka-replication-factor",
        "3",
        "--kafka-min-insync-replicas",
        "2",
        "--wal-operation-timeout",
        "5",
    )
    assert settings == {
        "bootstrap_servers": "b1:9093,b2:9093",
        "cluster": "prod",
        "kafka": {
            "client.id": "wal",
            "socket.keepalive.enable": "true",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "headrace",
            "sasl.password": "s3cret",
            "ssl.ca.location": str(Path(ca).absolute()),
            "security.protocol": "SASL_SSL",
        },
        "replication_factor": 3,
        "min_insync_replicas": 2,
        "operation_timeout_s": 5.0,
    }


def test_kafka_secrets_come_from_the_environment_when_no_file_is_given(tmp_path: Path) -> None:
    env = {
        "HEADRACE_KAFKA_SASL_MECHANISM": "PLAIN",
        "HEADRACE_KAFKA_SASL_USERNAME": "op",
        "HEADRACE_KAFKA_SASL_PASSWORD": "from-env",
    }
    settings = settings_of("--wal", "kafka", "--kafka-bootstrap", "b:9092", env=env)
    assert settings["kafka"] == {
        "sasl.mechanism": "PLAIN",
        "sasl.username": "op",
        "sasl.password": "from-env",
        "security.protocol": "SASL_PLAINTEXT",
    }
    password = write(tmp_path / "pw", "from-file")
    settings = settings_of(
        "--wal",
        "kafka",
        "--kafka-bootstrap",
        "b:9092",
        "--kafka-sasl-password-file",
        password,
        env=env,
    )
    assert settings["kafka"]["sasl.password"] == "from-file"


def test_plain_kafka_needs_no_client_settings() -> None:
    assert settings_of("--wal", "kafka", "--kafka-bootstrap", "b:9092") == {
        "bootstrap_servers": "b:9092",
        "cluster": "prod",
    }


def test_mutual_tls_implies_ssl(tmp_path: Path) -> None:
    cert, key = write(tmp_path / "c.pem", "C"), write(tmp_path / "k.pem", "K")
    settings = settings_of(
        "--wal",
        "kafka",
        "--kafka-bootstrap",
        "b:9093",
        "--kafka-ssl-cert",
        cert,
        "--kafka-ssl-key",
        key,
    )
    assert settings["kafka"]["security.protocol"] == "SSL"
    assert settings["kafka"]["ssl.key.location"] == str(Path(key).absolute())


@pytest.mark.parametrize(
    ("explicit", "sasl", "tls", "expected"),
    [
        (None, False, False, None),
        (None, True, False, "SASL_PLAINTEXT"),
        (None, True, True, "SASL_SSL"),
        (None, False, True, "SSL"),
        ("sasl_ssl", True, True, "SASL_SSL"),
        ("PLAINTEXT", False, False, "PLAINTEXT"),
    ],
)
def test_kafka_protocol(explicit: str | None, sasl: bool, tls: bool, expected: str | None) -> None:
    assert walflags.kafka_protocol(explicit, sasl, tls) == expected


@pytest.mark.parametrize(
    ("explicit", "sasl", "tls"), [("SSL", True, False), ("SASL_PLAINTEXT", True, True)]
)
def test_kafka_protocol_refuses_contradictions(explicit: str, sasl: bool, tls: bool) -> None:
    with pytest.raises(errors.InvalidArgument, match="security protocol"):
        walflags.kafka_protocol(explicit, sasl, tls)


# ----------------------------------------------------------------- pulsar


def test_pulsar_flags_become_client_settings(tmp_path: Path) -> None:
    token = write(tmp_path / "token", "  eyJhbGciOi.jwt \n")
    ca = write(tmp_path / "ca.pem", "CA")
    settings = settings_of(
        "--wal",
        "pulsar",
        "--pulsar-url",
        "pulsar+ssl://broker:6651",
        "--pulsar-token-file",
        token,
        "--pulsar-tls-ca",
        ca,
        "--pulsar-config",
        "tls_validate_hostname=true",
        "--pulsar-config",
        "io_threads=4",
        "--pulsar-config",
        "listener_name=internal",
        "--pulsar-tenant",
        "t1",
        "--pulsar-namespace",
        "wal",
    )
    assert settings == {
        "service_url": "pulsar+ssl://broker:6651",
        "cluster": "prod",
        "auth_token": "eyJhbGciOi.jwt",
        "pulsar": {
            "tls_validate_hostname": True,
            "io_threads": 4,
            "listener_name": "internal",
            "tls_trust_certs_file_path": str(Path(ca).absolute()),
        },
        "tenant": "t1",
        "namespace": "wal",
    }


def test_pulsar_token_from_the_environment() -> None:
    env = {"HEADRACE_PULSAR_TOKEN": "env-token"}
    settings = settings_of("--wal", "pulsar", "--pulsar-url", "pulsar://b:6650", env=env)
    assert settings["auth_token"] == "env-token"
    assert "auth_token" not in settings_of("--wal", "pulsar", "--pulsar-url", "pulsar://b:6650")


@pytest.mark.parametrize(
    ("text", "value"), [("true", True), ("False", False), ("12", 12), ("-1", -1), ("a.b", "a.b")]
)
def test_pulsar_config_values(text: str, value: object) -> None:
    assert walflags.pulsar_value(text) == value


# ----------------------------------------------------------------- errors


KAFKA = ["--wal", "kafka", "--kafka-bootstrap", "b:1"]
PULSAR = ["--wal", "pulsar", "--pulsar-url", "pulsar://b:1"]
SASL_PLAIN = [*KAFKA, "--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-username", "u"]


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["--wal", "kafka"], "needs --kafka-bootstrap"),
        (["--wal", "pulsar"], "needs --pulsar-url"),
        ([*KAFKA, "--kafka-config", "novalue"], "KEY=VALUE"),
        ([*KAFKA, "--kafka-config", "=x"], "KEY=VALUE"),
        ([*KAFKA, "--kafka-config", "a=1", "--kafka-config", "a=2"], "given twice"),
        ([*KAFKA, "--kafka-config", "sasl.password=x"], "secrets are not taken"),
        ([*KAFKA, "--kafka-config", "acks=1"], "set by the backend itself"),
        ([*KAFKA, "--kafka-config", "group.id=x"], "set by the backend itself"),
        ([*KAFKA, "--pulsar-url", "pulsar://b:1"], "--pulsar-url cannot be used with --wal kafka"),
        ([*PULSAR, "--kafka-sasl-username", "u"], "cannot be used with --wal pulsar"),
        (["--wal-dir", "/tmp/w", "--kafka-bootstrap", "b:1"], "cannot be used with --wal local"),
        (
            ["--wal-dir", "/tmp/w", "--wal-operation-timeout", "3"],
            "cannot be used with --wal local",
        ),
        ([*KAFKA, "--wal-dir", "/tmp/w"], "--wal-dir is for --wal local"),
        ([*KAFKA, "--kafka-sasl-mechanism", "PLAIN"], "needs --kafka-sasl-username"),
        ([*KAFKA, "--kafka-sasl-username", "u"], "needs --kafka-sasl-mechanism"),
        (
            [*KAFKA, "--kafka-sasl-mechanism", "GSSAPI", "--kafka-security-protocol", "SSL"],
            "SASL settings need",
        ),
        (
            [*KAFKA, "--kafka-security-protocol", "SSL", "--kafka-config", "security.protocol=SSL"],
            "both set it",
        ),
        ([*KAFKA, "--kafka-ssl-ca", "/no/such/ca.pem"], "no readable file"),
        (
            [*SASL_PLAIN, "--kafka-sasl-password-file", "/no/such/pw"],
            "cannot read it",
        ),
        ([*PULSAR, "--pulsar-token-file", "/no/such/token"], "cannot read it"),
        (["--wal", "pulsar", "--pulsar-url", "http://b:1"], "service_url"),
        ([*PULSAR, "--pulsar-config", "authentication=x"], "secrets are not taken"),
        ([*PULSAR, "--pulsar-config", "operation_timeout_seconds=3"], "set by the backend"),
    ],
)
def test_bad_broker_flags_are_refused(flags: list[str], match: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=match):
        settings_of(*flags)


def test_unknown_client_options_pass_through_to_the_client() -> None:
    assert settings_of(*PULSAR, "--pulsar-config", "auth=x")["pulsar"] == {"auth": "x"}
    assert settings_of(*KAFKA, "--kafka-config", "x.y=1")["kafka"] == {"x.y": "1"}


def test_files_are_checked(tmp_path: Path) -> None:
    empty = write(tmp_path / "empty", "\n")
    ca = write(tmp_path / "ca.pem", "CA")
    with pytest.raises(errors.InvalidArgument, match="is empty"):
        settings_of("--wal", "pulsar", "--pulsar-url", "pulsar://b:1", "--pulsar-token-file", empty)
    with pytest.raises(errors.InvalidArgument, match=r"pulsar\+ssl://"):
        settings_of("--wal", "pulsar", "--pulsar-url", "pulsar://b:1", "--pulsar-tls-ca", ca)
    with pytest.raises(errors.InvalidArgument, match="go together"):
        settings_of("--wal", "pulsar", "--pulsar-url", "pulsar+ssl://b:1", "--pulsar-tls-cert", ca)
    with pytest.raises(errors.InvalidArgument, match="no readable file"):
        settings_of("--wal", "kafka", "--kafka-bootstrap", "b:1", "--kafka-ssl-ca", str(tmp_path))
    with pytest.raises(errors.InvalidArgument, match="both set"):
        settings_of(
            "--wal",
            "kafka",
            "--kafka-bootstrap",
            "b:1",
            "--kafka-ssl-ca",
            ca,
            "--kafka-config",
            "ssl.ca.location=/x",
        )


def test_argparse_refuses_unknown_choices() -> None:
    with pytest.raises(SystemExit):
        node_args("--wal", "kafka", "--kafka-bootstrap", "b:1", "--kafka-sasl-mechanism", "MD5")
    with pytest.raises(SystemExit):
        node_args("--wal", "rabbitmq")


# ------------------------------------------------------------- standalone


def standalone_args(data_dir: Path, *flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["standalone", "--data-dir", str(data_dir), *flags])


def test_standalone_hands_broker_flags_to_its_nodes(tmp_path: Path) -> None:
    password = write(tmp_path / "pw", "never-on-a-command-line")
    ca = write(tmp_path / "ca.pem", "CA")
    args = standalone_args(
        tmp_path / "data",
        "--wal",
        "kafka",
        "--kafka-bootstrap",
        "b:9093",
        "--kafka-sasl-mechanism",
        "PLAIN",
        "--kafka-sasl-username",
        "u",
        "--kafka-sasl-password-file",
        password,
        "--kafka-ssl-ca",
        ca,
        "--kafka-config",
        "client.id=x",
        "--wal-operation-timeout",
        "4",
    )
    cfg = standalone_config(args, {})
    assert cfg.wal == "kafka"
    command = standalone_node_command(cfg, "node-0")
    assert "never-on-a-command-line" not in " ".join(command)
    assert "--wal-dir" not in command
    # What the node process makes of it is what the standalone checked.
    node = build_parser().parse_args(command[command.index("node") :])
    assert node.kafka_sasl_password_file == str(Path(password).absolute())
    assert wal_settings(node, {}) == {
        "bootstrap_servers": "b:9093",
        "cluster": "default",
        "kafka": {
            "client.id": "x",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "never-on-a-command-line",
            "ssl.ca.location": str(Path(ca).absolute()),
            "security.protocol": "SASL_SSL",
        },
        "operation_timeout_s": 4.0,
    }


def test_standalone_checks_broker_flags_before_starting(tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidArgument, match="needs --pulsar-url"):
        standalone_config(standalone_args(tmp_path, "--wal", "pulsar"), {})
    with pytest.raises(errors.InvalidArgument, match="cannot be used with --wal local"):
        standalone_config(standalone_args(tmp_path, "--kafka-bootstrap", "b:1"), {})
    local = standalone_config(standalone_args(tmp_path), {})
    assert "--wal-dir" in standalone_node_command(local, "node-0")
    with pytest.raises(errors.InvalidArgument, match="need --wal kafka or pulsar"):
        StandaloneConfig(data_dir=tmp_path, wal_args=("--kafka-bootstrap", "b:1")).validate()
    with pytest.raises(errors.InvalidArgument, match="unknown WAL backend"):
        StandaloneConfig(data_dir=tmp_path, wal="rabbitmq").validate()


# --------------------------------------------------------- chaos clusters


def test_cluster_spec_hands_broker_settings_to_node_processes(tmp_path: Path) -> None:
    spec = ClusterSpec(
        root=tmp_path,
        cluster="chaos",
        backend="kafka",
        backend_settings={
            "bootstrap_servers": "b:9092",
            "operation_timeout_s": 5.0,
            "replication_factor": 3,
            "kafka": {"enable.ssl.certificate.verification": False, "client.id": "c"},
        },
    )
    spec.validate()
    command = node_command(spec, "node-0")
    assert command[command.index("--kafka-config") + 1] == "client.id=c"
    node = build_parser().parse_args(command[command.index("node") :])
    assert wal_settings(node, {}) == {
        **spec.node_backend_settings(),
        "kafka": {"client.id": "c", "enable.ssl.certificate.verification": "false"},
    }


def test_backend_args_keep_secrets_off_the_command_line() -> None:
    with pytest.raises(errors.InvalidArgument, match="is a secret"):
        backend_args("kafka", {"bootstrap_servers": "b:1", "kafka": {"sasl.password": "x"}})
    with pytest.raises(errors.InvalidArgument, match="is a secret"):
        backend_args("pulsar", {"service_url": "pulsar://b:1", "auth_token": "x"})
    with pytest.raises(errors.InvalidArgument, match="cannot be passed"):
        backend_args("pulsar", {"service_url": "pulsar://b:1", "cluster": "x"})
    with pytest.raises(errors.InvalidArgument, match="must be a mapping"):
        backend_args("pulsar", {"service_url": "pulsar://b:1", "pulsar": "use_tls"})
    assert backend_args("pulsar", {"service_url": "pulsar://b:1", "pulsar": {"use_tls": True}}) == [
        "--wal",
        "pulsar",
        "--pulsar-config",
        "use_tls=true",
        "--pulsar-url",
        "pulsar://b:1",
    ]


# ------------------------------------------- retries and bounds of opening


def test_retry_delay_doubles_up_to_the_cap() -> None:
    assert [retry_delay(n, 0.5, 10.0) for n in range(1, 8)] == [0.5, 1, 2, 4, 8, 10, 10]
    assert retry_delay(10_000, 0.5, 10.0) == 10.0


def test_open_bound_follows_the_operation_timeout() -> None:
    assert open_timeout(WALOptions(), {"backend": "kafka", "operation_timeout_s": 30.0}) == 120.0
    assert open_timeout(WALOptions(), {"backend": "local"}) == DEFAULT_OPEN_TIMEOUT_S
    assert open_timeout(WALOptions(), {"operation_timeout_s": True}) == DEFAULT_OPEN_TIMEOUT_S


def test_failures_count_attempts_per_term() -> None:
    down = errors.Unavailable("kafka broker b:1 is down")
    first = next_failure(None, "p", 3, down, 100.0)
    second = next_failure(first, "p", 3, down, 105.0)
    assert (second.attempts, second.since, second.last) == (2, 100.0, 105.0)
    assert next_failure(second, "p", 4, down, 110.0).attempts == 1
    info = failed_wal_info(second)
    assert (info.pchannel, info.term, info.state) == ("p", 3, "UNAVAILABLE")
    assert info.stats["error"] == "UNAVAILABLE: kafka broker b:1 is down"
    assert (info.stats["retryable"], info.stats["attempts"]) == ("true", "2")


def test_broker_calls_are_bounded_by_the_operation_timeout() -> None:
    pulsar = parse_pulsar({"service_url": "pulsar://b:1", "operation_timeout_s": 2.0})
    assert pulsar.client_kwargs()["connection_timeout_ms"] == 2000
    assert pulsar.client_kwargs()["operation_timeout_seconds"] == 2
    assert (
        parse_pulsar({"service_url": "pulsar://b:1"}).client_kwargs()["connection_timeout_ms"]
        == 10_000
    )
    own = parse_pulsar({"service_url": "pulsar://b:1", "pulsar": {"connection_timeout_ms": 500}})
    assert own.client_kwargs()["connection_timeout_ms"] == 500
    kafka = parse_kafka({"bootstrap_servers": "b:1", "operation_timeout_s": 5.0})
    assert open_timeout(WALOptions(), kafka.describe()) == 20.0
    assert open_timeout(WALOptions(), pulsar.describe()) == 8.0


@pytest.mark.parametrize(
    ("state", "node", "held", "action"),
    [
        (AssignmentState.ASSIGNED, "me", 4, Action.REOPEN),
        (AssignmentState.ASSIGNED, "me", None, Action.REOPEN),
        (AssignmentState.ASSIGNED, "other", 4, Action.CLOSE),
        (AssignmentState.ASSIGNING, "me", None, Action.OPEN),
        (AssignmentState.UNASSIGNING, "me", 4, Action.RELEASE),
    ],
)
def test_a_wal_lost_to_its_backend_is_reopened_while_assigned_here(
    state: AssignmentState, node: str, held: int | None, action: Action
) -> None:
    record = Assignment(pchannel="p", state=state, term=4, node=node)
    assert decide(record, "me", held, broken=True) is action
    newer = record.model_copy(update={"term": 5})
    assert decide(newer, "me", 4, broken=True) is not Action.REOPEN
