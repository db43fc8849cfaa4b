"""pytest plugin: one real Kafka broker and one real Pulsar standalone per session.

Both are started by the project's test bed (``scripts/headrace_testbed/kafka.py``
and ``pulsar.py``: jars from Maven Central, cached) on free loopback ports, on
first use only, and stopped when the session ends. Missing Java or Maven fails
the tests that need a broker, with the reason; nothing is skipped silently.
Set ``HEADRACE_KAFKA_BOOTSTRAP=host:port`` or
``HEADRACE_PULSAR_URL=pulsar://host:port`` to use brokers that already run.

Fixtures: ``kafka_bootstrap`` and ``pulsar_url`` (session scope), and
``broker_control(kind)`` (see :func:`broker_control`): the session broker as
a chaos run's :class:`~headrace.bench.broker_faults.BrokerControl`. Code that
gets no fixture request (the conformance suite's backend cases) calls
:func:`kafka_bootstrap_address` / :func:`pulsar_service_url`, which share the
same servers. Tests that use them carry the ``kafka`` / ``pulsar`` marks.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from headrace import errors
from headrace_testbed import TestbedError
from headrace_testbed.kafka import KafkaBroker, start_kafka
from headrace_testbed.pulsar import PulsarStandalone, start_pulsar

_Server = TypeVar("_Server", KafkaBroker, PulsarStandalone)
_RUNNING: dict[str, KafkaBroker | PulsarStandalone] = {}


def _stop(kind: str) -> None:
    server = _RUNNING.pop(kind, None)
    if server is not None:
        server.stop()
        shutil.rmtree(server.server.data_dir, ignore_errors=True)


def _shared(kind: str, start: Callable[[Path], _Server], expected: type[_Server]) -> _Server:
    server = _RUNNING.get(kind)
    if server is None:
        data_dir = Path(tempfile.mkdtemp(prefix=f"headrace-{kind}-"))
        try:
            server = start(data_dir)
        except TestbedError as exc:
            shutil.rmtree(data_dir, ignore_errors=True)
            pytest.fail(f"cannot start the {kind} test server: {exc}", pytrace=False)
        _RUNNING[kind] = server
        atexit.register(_stop, kind)
    assert isinstance(server, expected)
    return server


def kafka_bootstrap_address() -> str:
    """``host:port`` of a real Kafka broker, started on first use."""
    external = os.environ.get("HEADRACE_KAFKA_BOOTSTRAP")
    if external:
        return external
    return _shared("kafka", start_kafka, KafkaBroker).bootstrap


def pulsar_service_url() -> str:
    """``pulsar://host:port`` of a real Pulsar standalone, started on first use."""
    external = os.environ.get("HEADRACE_PULSAR_URL")
    if external:
        return external
    return _shared("pulsar", start_pulsar, PulsarStandalone).service_url


@pytest.fixture(scope="session", autouse=True)
def stop_brokers_at_session_end() -> Iterator[None]:
    yield
    for kind in list(_RUNNING):
        _stop(kind)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """``host:port`` of a real Kafka broker (the session broker unless overridden)."""
    return kafka_bootstrap_address()


@pytest.fixture(scope="session")
def pulsar_url() -> str:
    """``pulsar://host:port`` of a real Pulsar (the session standalone unless overridden)."""
    return pulsar_service_url()


class _SessionBrokerControl:
    """A session broker stalled and restarted by a chaos run (restarted on the
    same ports and data, so later tests find it where it was)."""

    def __init__(self, server: KafkaBroker | PulsarStandalone) -> None:
        self.server = server

    def pid(self) -> int:
        return self.server.server.pid

    async def restart(self) -> None:
        try:
            await asyncio.to_thread(self.server.restart)
        except TestbedError as exc:
            raise errors.Unavailable(f"restarting the test broker failed: {exc}") from None


@pytest.fixture(scope="session")
def broker_control() -> Callable[[str], _SessionBrokerControl]:
    """``broker_control("kafka" | "pulsar")``: the session broker as a chaos
    run's BrokerControl. Brokers named by the environment are not ours to stop:
    the test is skipped, saying so."""

    def control(kind: str) -> _SessionBrokerControl:
        env = {"kafka": "HEADRACE_KAFKA_BOOTSTRAP", "pulsar": "HEADRACE_PULSAR_URL"}[kind]
        if os.environ.get(env):
            pytest.skip(f"{env} names an external broker; broker faults need the test bed's own")
        if kind == "kafka":
            kafka_bootstrap_address()
        else:
            pulsar_service_url()
        return _SessionBrokerControl(_RUNNING[kind])

    return control


@pytest.fixture(scope="session")
def pulsar_admin_url() -> str:
    """``http://host:port`` of the session Pulsar standalone's admin REST API. An
    external broker (``HEADRACE_PULSAR_URL``) needs ``HEADRACE_PULSAR_ADMIN_URL``
    too, else the test is skipped, saying so."""
    if os.environ.get("HEADRACE_PULSAR_URL"):
        external = os.environ.get("HEADRACE_PULSAR_ADMIN_URL")
        if not external:
            pytest.skip(
                "HEADRACE_PULSAR_URL names an external broker without HEADRACE_PULSAR_ADMIN_URL"
            )
        return external
    pulsar_service_url()
    server = _RUNNING["pulsar"]
    assert isinstance(server, PulsarStandalone)
    return server.admin_url
