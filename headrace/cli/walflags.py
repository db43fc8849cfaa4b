"""Kafka and Pulsar flags of ``headrace node`` and ``headrace standalone``.

:data:`FLAGS` lists every broker flag once; it drives the argument parser
(:func:`add_broker_args`), the backend settings a node builds from its
arguments (:func:`broker_settings`) and the flags the standalone hands on to
its node processes (:func:`forward_flags`).

The node's ``--cluster`` goes to the backend too: it names the topics
(``headrace.<cluster>.<pchannel>``), so clusters sharing a broker stay apart.

Secrets never have a flag of their own: they come from a file
(``--kafka-sasl-password-file``, ``--pulsar-token-file``, ...) or from an
environment variable (:data:`SECRET_ENV`), so ``ps`` never shows them, and
``--kafka-config`` / ``--pulsar-config`` refuse secret-looking keys.
Certificates are file paths; a file that cannot be read is refused at start.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from headrace import errors
from headrace.wal.framework import OPEN_TIMEOUT_FACTOR
from headrace.wal.kafka.settings import parse_settings as parse_kafka
from headrace.wal.pulsar.settings import DEDUPLICATION_MODES
from headrace.wal.pulsar.settings import parse_settings as parse_pulsar

BROKERS = ("kafka", "pulsar")
SECRET_ENV = {
    "--kafka-sasl-password-file": "HEADRACE_KAFKA_SASL_PASSWORD",
    "--kafka-ssl-key-password-file": "HEADRACE_KAFKA_SSL_KEY_PASSWORD",
    "--pulsar-token-file": "HEADRACE_PULSAR_TOKEN",
}
"""Environment variable read when the secret's file flag is not given."""
PLAIN_ENV = {
    "--kafka-sasl-mechanism": "HEADRACE_KAFKA_SASL_MECHANISM",
    "--kafka-sasl-username": "HEADRACE_KAFKA_SASL_USERNAME",
}
"""Environment fallbacks of non-secret flags (as the Kubernetes operator sets them)."""

_KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_KAFKA_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")
_NEEDS_PASSWORD = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_SECRET_WORDS = ("password", "secret")
_SECRET_KEYS = frozenset({"ssl.key.pem", "sasl.oauthbearer.config", "authentication"})


@dataclasses.dataclass(frozen=True, slots=True)
class Flag:
    name: str
    backend: str
    """``kafka``, ``pulsar`` or ``*`` (either broker)."""
    help: str
    kind: str = "value"
    """``value``; ``path`` (a file, forwarded as an absolute path); ``list`` (repeatable)."""
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    type: Callable[[str], Any] = str

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")


FLAGS = (
    Flag("--kafka-bootstrap", "kafka", "bootstrap brokers", metavar="HOST:PORT[,HOST:PORT]"),
    Flag(
        "--kafka-security-protocol",
        "kafka",
        "default: SASL_SSL, SASL_PLAINTEXT or SSL as the SASL/TLS flags imply, else PLAINTEXT",
        choices=_KAFKA_PROTOCOLS,
    ),
    Flag(
        "--kafka-sasl-mechanism",
        "kafka",
        "env HEADRACE_KAFKA_SASL_MECHANISM",
        choices=_KAFKA_MECHANISMS,
    ),
    Flag("--kafka-sasl-username", "kafka", "env HEADRACE_KAFKA_SASL_USERNAME", metavar="USER"),
    Flag(
        "--kafka-sasl-password-file",
        "kafka",
        "file holding the SASL password (else env HEADRACE_KAFKA_SASL_PASSWORD)",
        kind="path",
        metavar="FILE",
    ),
    Flag(
        "--kafka-ssl-ca",
        "kafka",
        "CA certificate(s) to verify the brokers",
        kind="path",
        metavar="FILE",
    ),
    Flag(
        "--kafka-ssl-cert", "kafka", "client certificate (mutual TLS)", kind="path", metavar="FILE"
    ),
    Flag(
        "--kafka-ssl-key", "kafka", "client private key (mutual TLS)", kind="path", metavar="FILE"
    ),
    Flag(
        "--kafka-ssl-key-password-file",
        "kafka",
        "file holding the key's password (else env HEADRACE_KAFKA_SSL_KEY_PASSWORD)",
        kind="path",
        metavar="FILE",
    ),
    Flag(
        "--kafka-replication-factor",
        "kafka",
        "of topics the node creates (default 1)",
        type=int,
        metavar="N",
    ),
    Flag(
        "--kafka-min-insync-replicas", "kafka", "of topics the node creates", type=int, metavar="N"
    ),
    Flag(
        "--kafka-config",
        "kafka",
        "any other librdkafka setting (repeatable; no secrets)",
        kind="list",
        metavar="KEY=VALUE",
    ),
    Flag("--pulsar-url", "pulsar", "service URL", metavar="pulsar://HOST:PORT"),
    Flag(
        "--pulsar-token-file",
        "pulsar",
        "file holding a JWT for token authentication (else env HEADRACE_PULSAR_TOKEN)",
        kind="path",
        metavar="FILE",
    ),
    Flag(
        "--pulsar-tls-ca",
        "pulsar",
        "CA certificate(s); needs a pulsar+ssl:// URL",
        kind="path",
        metavar="FILE",
    ),
    Flag(
        "--pulsar-tls-cert",
        "pulsar",
        "client certificate (mutual TLS)",
        kind="path",
        metavar="FILE",
    ),
    Flag(
        "--pulsar-tls-key", "pulsar", "client private key (mutual TLS)", kind="path", metavar="FILE"
    ),
    Flag("--pulsar-tenant", "pulsar", "tenant of the topics (default public)", metavar="NAME"),
    Flag(
        "--pulsar-namespace", "pulsar", "namespace of the topics (default default)", metavar="NAME"
    ),
    Flag(
        "--pulsar-deduplication",
        "pulsar",
        "require (default: refuse a broker that does not deduplicate the WAL's topics) or warn",
        choices=DEDUPLICATION_MODES,
    ),
    Flag(
        "--pulsar-config",
        "pulsar",
        "any other pulsar.Client option (repeatable; true/false and integers are converted)",
        kind="list",
        metavar="KEY=VALUE",
    ),
    Flag(
        "--wal-operation-timeout",
        "*",
        f"bound of every broker call (default 30); opening a WAL gets {OPEN_TIMEOUT_FACTOR}x it",
        type=float,
        metavar="SECONDS",
    ),
)
_BY_NAME = {flag.name: flag for flag in FLAGS}


def add_broker_args(p: argparse.ArgumentParser) -> None:
    """The broker flags, in one group per backend."""
    groups = {
        "kafka": p.add_argument_group("Kafka WAL (--wal kafka)"),
        "pulsar": p.add_argument_group("Pulsar WAL (--wal pulsar)"),
        "*": p.add_argument_group("Kafka or Pulsar WAL"),
    }
    for flag in FLAGS:
        kwargs: dict[str, Any] = {"default": None, "help": flag.help, "metavar": flag.metavar}
        if flag.kind == "list":
            kwargs["action"] = "append"
        else:
            kwargs["type"] = flag.type
        if flag.choices is not None:
            kwargs["choices"] = flag.choices
        groups[flag.backend].add_argument(flag.name, **kwargs)


def given(args: argparse.Namespace) -> list[Flag]:
    """The broker flags set on the command line."""
    return [flag for flag in FLAGS if getattr(args, flag.dest, None) is not None]


def check_backend(args: argparse.Namespace, backend: str) -> None:
    """InvalidArgument for broker flags that do not apply to ``backend``."""
    if backend in BROKERS:
        wrong = [f.name for f in given(args) if f.backend not in (backend, "*")]
    else:
        wrong = [f.name for f in given(args)]
    if wrong:
        raise errors.InvalidArgument(
            f"{', '.join(wrong)} cannot be used with --wal {backend}; "
            f"{'they apply' if len(wrong) > 1 else 'it applies'} to another WAL backend"
        )


def forward_flags(args: argparse.Namespace) -> list[str]:
    """The broker flags of ``args`` for a node command line (pure).

    Files become absolute paths; secrets are never values here (they are files,
    or environment variables the node processes inherit).
    """
    argv: list[str] = []
    for flag in given(args):
        value = getattr(args, flag.dest)
        if flag.kind == "list":
            for item in value:
                argv += [flag.name, str(item)]
        elif flag.kind == "path":
            argv += [flag.name, str(Path(value).absolute())]
        else:
            argv += [flag.name, str(value)]
    return argv


def parse_pairs(items: Sequence[str] | None, flag: str) -> dict[str, str]:
    """``KEY=VALUE`` items as a dict; InvalidArgument for a malformed or repeated key."""
    pairs: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise errors.InvalidArgument(f"{flag} {item!r}: expected KEY=VALUE")
        if key in pairs:
            raise errors.InvalidArgument(f"{flag}: {key} is given twice")
        if key in _SECRET_KEYS or any(word in key.lower() for word in _SECRET_WORDS):
            raise errors.InvalidArgument(
                f"{flag} {key}=...: secrets are not taken on the command line (ps shows "
                f"it); use {' or '.join(secret_sources(flag))}"
            )
        pairs[key] = value
    return pairs


def secret_sources(flag: str) -> list[str]:
    """Where the secrets of ``flag``'s backend may come from (pure)."""
    backend = flag.removeprefix("--").split("-", 1)[0]
    return [
        f"{name} FILE (or env {env})"
        for name, env in sorted(SECRET_ENV.items())
        if name.startswith(f"--{backend}-")
    ]


def read_secret(
    args: argparse.Namespace, flag: str, env: Mapping[str, str], *, strip: bool = False
) -> str | None:
    """The secret from ``flag``'s file, else from its environment variable, else None."""
    path = getattr(args, _BY_NAME[flag].dest, None)
    if path is None:
        value = env.get(SECRET_ENV[flag])
        return value if value else None
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.InvalidArgument(f"{flag} {path}: cannot read it: {exc}") from None
    text = text.strip() if strip else text.rstrip("\r\n")
    if not text:
        raise errors.InvalidArgument(f"{flag} {path}: the file is empty")
    return text


def _path(args: argparse.Namespace, flag: str) -> str | None:
    """The absolute path given to ``flag`` after checking the file can be read."""
    value = getattr(args, _BY_NAME[flag].dest, None)
    if value is None:
        return None
    path = Path(value).absolute()
    if not os.access(path, os.R_OK) or not path.is_file():
        raise errors.InvalidArgument(f"{flag} {value}: no readable file there")
    return str(path)


def _merge(config: dict[str, Any], key: str, value: Any, flag: str, generic: str) -> None:
    if value is None:
        return
    if key in config:
        raise errors.InvalidArgument(f"{flag} and {generic} {key}=... both set {key}; set it once")
    config[key] = value


def kafka_protocol(explicit: str | None, sasl: bool, tls: bool) -> str | None:
    """The ``security.protocol`` to use, None to leave librdkafka's default (pure)."""
    if explicit is None:
        if sasl:
            return "SASL_SSL" if tls else "SASL_PLAINTEXT"
        return "SSL" if tls else None
    protocol = explicit.upper()
    if sasl and not protocol.startswith("SASL_"):
        raise errors.InvalidArgument(
            f"SASL settings need security protocol SASL_PLAINTEXT or SASL_SSL, not {explicit}"
        )
    if tls and not protocol.endswith("SSL"):
        raise errors.InvalidArgument(
            f"TLS files need security protocol SSL or SASL_SSL, not {explicit}"
        )
    return protocol


def _kafka_sasl(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, str]:
    mechanism = args.kafka_sasl_mechanism or env.get(PLAIN_ENV["--kafka-sasl-mechanism"]) or None
    username = args.kafka_sasl_username or env.get(PLAIN_ENV["--kafka-sasl-username"]) or None
    password = read_secret(args, "--kafka-sasl-password-file", env)
    if mechanism is None:
        if username is not None or password is not None:
            raise errors.InvalidArgument(
                "a Kafka SASL username or password needs --kafka-sasl-mechanism "
                f"({', '.join(_KAFKA_MECHANISMS)})"
            )
        return {}
    if mechanism not in _KAFKA_MECHANISMS:
        raise errors.InvalidArgument(
            f"unknown Kafka SASL mechanism {mechanism!r} (known: {', '.join(_KAFKA_MECHANISMS)})"
        )
    if mechanism in _NEEDS_PASSWORD and (username is None or password is None):
        raise errors.InvalidArgument(
            f"Kafka SASL {mechanism} needs --kafka-sasl-username USER and a password "
            "(--kafka-sasl-password-file FILE or env HEADRACE_KAFKA_SASL_PASSWORD)"
        )
    sasl = {"sasl.mechanism": mechanism}
    if username is not None:
        sasl["sasl.username"] = username
    if password is not None:
        sasl["sasl.password"] = password
    return sasl


def kafka_settings(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """Backend settings of ``--wal kafka``."""
    if not args.kafka_bootstrap:
        raise errors.InvalidArgument("--wal kafka needs --kafka-bootstrap HOST:PORT")
    generic = "--kafka-config"
    config: dict[str, Any] = parse_pairs(args.kafka_config, generic)
    sasl = _kafka_sasl(args, env)
    for key, value in sasl.items():
        _merge(config, key, value, "--kafka-sasl-*", generic)
    tls = {
        "ssl.ca.location": _path(args, "--kafka-ssl-ca"),
        "ssl.certificate.location": _path(args, "--kafka-ssl-cert"),
        "ssl.key.location": _path(args, "--kafka-ssl-key"),
        "ssl.key.password": read_secret(args, "--kafka-ssl-key-password-file", env),
    }
    for key, location in tls.items():
        _merge(config, key, location, "--kafka-ssl-*", generic)
    explicit = args.kafka_security_protocol
    if explicit is not None and "security.protocol" in config:
        raise errors.InvalidArgument(
            "--kafka-security-protocol and --kafka-config security.protocol=... both set it"
        )
    explicit = explicit or config.pop("security.protocol", None)
    protocol = kafka_protocol(explicit, bool(sasl), any(v is not None for v in tls.values()))
    if protocol is not None:
        config["security.protocol"] = protocol
    settings: dict[str, Any] = {"bootstrap_servers": args.kafka_bootstrap, "cluster": args.cluster}
    if config:
        settings["kafka"] = config
    _set_given(
        settings,
        replication_factor=args.kafka_replication_factor,
        min_insync_replicas=args.kafka_min_insync_replicas,
        operation_timeout_s=args.wal_operation_timeout,
    )
    parse_kafka(settings)
    return settings


def _set_given(settings: dict[str, Any], **values: Any) -> None:
    """Add the values that were given (not None) to ``settings``."""
    settings.update({key: value for key, value in values.items() if value is not None})


def pulsar_value(text: str) -> bool | int | str:
    """A ``--pulsar-config`` value as the client wants it: bool, int or str (pure)."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text


def pulsar_settings(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """Backend settings of ``--wal pulsar``."""
    url = args.pulsar_url
    if not url:
        raise errors.InvalidArgument("--wal pulsar needs --pulsar-url pulsar://HOST:PORT")
    generic = "--pulsar-config"
    options: dict[str, Any] = {
        k: pulsar_value(v) for k, v in parse_pairs(args.pulsar_config, generic).items()
    }
    tls = {
        "tls_trust_certs_file_path": _path(args, "--pulsar-tls-ca"),
        "tls_certificate_file_path": _path(args, "--pulsar-tls-cert"),
        "tls_private_key_file_path": _path(args, "--pulsar-tls-key"),
    }
    if any(v is not None for v in tls.values()) and not url.startswith("pulsar+ssl://"):
        raise errors.InvalidArgument("--pulsar-tls-* files need a pulsar+ssl:// --pulsar-url")
    if (args.pulsar_tls_cert is None) != (args.pulsar_tls_key is None):
        raise errors.InvalidArgument("--pulsar-tls-cert and --pulsar-tls-key go together")
    for key, location in tls.items():
        _merge(options, key, location, "--pulsar-tls-*", generic)
    settings: dict[str, Any] = {"service_url": url, "cluster": args.cluster}
    token = read_secret(args, "--pulsar-token-file", env, strip=True)
    if token is not None:
        settings["auth_token"] = token
    if options:
        settings["pulsar"] = options
    _set_given(
        settings,
        tenant=args.pulsar_tenant,
        namespace=args.pulsar_namespace,
        deduplication=args.pulsar_deduplication,
        operation_timeout_s=args.wal_operation_timeout,
    )
    parse_pulsar(settings)
    return settings


def broker_settings(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Backend settings of ``args.wal`` (kafka or pulsar) from flags, files and ``env``.

    Its only I/O is reading the files the flags name. InvalidArgument says
    what is wrong: a missing flag or file, a bad KEY=VALUE, a flag of the
    other backend, a secret on the command line, a key the backend owns.
    """
    environ = os.environ if env is None else env
    check_backend(args, args.wal)
    if args.wal == "kafka":
        return kafka_settings(args, environ)
    return pulsar_settings(args, environ)
