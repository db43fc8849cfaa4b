"""Settings of the Pulsar backend (pure).

Keyword settings (``registry.create("pulsar", ...)``):

* ``service_url`` (required): ``pulsar://host:port`` or ``pulsar+ssl://...``.
* ``tenant`` (``"public"``), ``namespace`` (``"default"``), ``cluster``
  (``"default"``) and ``topic_prefix`` (``"headrace.<cluster>."``): pchannel
  ``p`` is ``persistent://<tenant>/<namespace>/<topic_prefix><p>``; its
  truncation marks live in ``...<topic_prefix>__truncation.<p>``.
* ``operation_timeout_s`` (30.0): bound of every blocking client call, and of
  connecting to a broker (at most 10 s; ``pulsar.connection_timeout_ms`` overrides).
* ``send_timeout_ms`` (30000): a send not acknowledged by then fails.
* ``auth_token``: a JWT for token authentication (not shown by ``describe``).
* ``deduplication`` (``"require"``): the broker must deduplicate the WAL's
  topics (``brokerDeduplicationEnabled`` or the namespace/topic policy), which
  every writer checks when it takes its topic; a broker that does not is
  refused with a clear error. ``"warn"`` only logs a warning and writes on:
  then a record the client resends after a lost connection can be stored twice.
* ``pulsar`` (a dict) and any ``pulsar.<name>`` keyword: further keyword
  arguments of ``pulsar.Client`` (``use_tls``, ``tls_trust_certs_file_path``,
  ``authentication``, ``listener_name``, ...).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from headrace import errors
from headrace.wal.brokers.settings import client_options, integer, positive_number, refuse_unknown

_NAME = re.compile(r"^[A-Za-z0-9._\-=:]+$")
TRUNCATION_INFIX = "__truncation."
SUBSCRIPTION = "headrace-truncation"
"""Durable subscription that holds the data: its cursor is the truncation point."""
KEEP_SUBSCRIPTION = "headrace-keep"
"""Durable subscription of the truncation-mark topic that is never acknowledged."""
_OWNED = frozenset({"service_url", "operation_timeout_seconds", "logger"})
DEDUPLICATION_MODES = ("require", "warn")


@dataclasses.dataclass(frozen=True)
class PulsarSettings:
    service_url: str
    tenant: str = "public"
    namespace: str = "default"
    topic_prefix: str = "headrace.default."
    operation_timeout_s: float = 30.0
    send_timeout_ms: int = 30_000
    auth_token: str | None = None
    deduplication: str = "require"
    client: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def topic(self, pchannel: str) -> str:
        """Full topic name of ``pchannel``; InvalidArgument if Pulsar cannot name it."""
        if not isinstance(pchannel, str) or not pchannel or pchannel.startswith("__"):
            raise errors.InvalidArgument(
                f"invalid pchannel name {pchannel!r} (empty, or starts with '__', which the "
                "pulsar backend keeps for its own topics)"
            )
        local = f"{self.topic_prefix}{pchannel}"
        if not _NAME.match(local):
            raise errors.InvalidArgument(
                f"pchannel {pchannel!r} gives the Pulsar topic name {local!r}, which Pulsar "
                "refuses: use only letters, digits and '.', '_', '-', '=', ':'"
            )
        return f"persistent://{self.tenant}/{self.namespace}/{local}"

    def marks_topic(self, pchannel: str) -> str:
        """Topic of the truncation marks of ``pchannel``."""
        self.topic(pchannel)
        local = f"{self.topic_prefix}{TRUNCATION_INFIX}{pchannel}"
        return f"persistent://{self.tenant}/{self.namespace}/{local}"

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``pulsar.Client``.

        Connecting to a broker is bounded by ``operation_timeout_s`` too (unless
        ``connection_timeout_ms`` is set), so an unreachable broker fails an
        open within that bound rather than the client's own 10 s.
        """
        connect_ms = min(10_000, max(100, round(self.operation_timeout_s * 1000)))
        return {
            "connection_timeout_ms": connect_ms,
            **self.client,
            "operation_timeout_seconds": max(1, round(self.operation_timeout_s)),
        }

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "pulsar",
            "service_url": self.service_url,
            "tenant": self.tenant,
            "namespace": self.namespace,
            "topic_prefix": self.topic_prefix,
            "operation_timeout_s": self.operation_timeout_s,
            "deduplication": self.deduplication,
            "auth": "token"
            if self.auth_token
            else ("custom" if "authentication" in self.client else "none"),
            "client": sorted(self.client),
        }


_KNOWN = frozenset(
    {
        "service_url",
        "tenant",
        "namespace",
        "cluster",
        "topic_prefix",
        "operation_timeout_s",
        "send_timeout_ms",
        "auth_token",
        "deduplication",
        "pulsar",
    }
)


def _name(raw: Mapping[str, Any], key: str, default: str) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str) or not _NAME.match(value):
        raise errors.InvalidArgument(f"pulsar setting {key} must be a valid name, got {value!r}")
    return value


def parse_settings(raw: Mapping[str, Any]) -> PulsarSettings:
    """Validate keyword settings; InvalidArgument names the bad one."""
    refuse_unknown(raw, _KNOWN, "pulsar")
    url = raw.get("service_url")
    if not isinstance(url, str) or not url.startswith(("pulsar://", "pulsar+ssl://")):
        raise errors.InvalidArgument(
            "pulsar backend needs service_url, e.g. 'pulsar://127.0.0.1:6650'"
        )
    cluster = _name(raw, "cluster", "default")
    prefix = raw.get("topic_prefix", f"headrace.{cluster}.")
    if not isinstance(prefix, str) or (prefix and not _NAME.match(prefix)):
        raise errors.InvalidArgument(f"pulsar setting topic_prefix is not a valid name: {prefix!r}")
    token = raw.get("auth_token")
    if token is not None and not isinstance(token, str):
        raise errors.InvalidArgument("pulsar setting auth_token must be a string")
    deduplication = raw.get("deduplication", "require")
    if deduplication not in DEDUPLICATION_MODES:
        raise errors.InvalidArgument(
            f"pulsar setting deduplication must be one of {', '.join(DEDUPLICATION_MODES)}, "
            f"got {deduplication!r}"
        )
    return PulsarSettings(
        service_url=url,
        tenant=_name(raw, "tenant", "public"),
        namespace=_name(raw, "namespace", "default"),
        topic_prefix=prefix,
        operation_timeout_s=positive_number(raw, "operation_timeout_s", 30.0, "pulsar"),
        send_timeout_ms=integer(raw, "send_timeout_ms", 30_000, 1, "pulsar"),
        auth_token=token,
        deduplication=deduplication,
        client=client_options(raw, "pulsar", _OWNED),
    )
