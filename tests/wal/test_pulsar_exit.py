"""A process that used the Pulsar client exits cleanly, and the client logs to stderr.

pulsar-client aborts some processes at interpreter exit ("terminate called
without an active exception", exit code 134) when its clients log through a
Python logger (apache/pulsar-client-python#256): its threads call into the
interpreter while it shuts down. The backend therefore gives the client the
library's own file logger on stderr, at the level of the backend's Python
logger. (A minimal script with a Python logger aborted in 5 of 30 runs on
the test bed's broker, with the library's logger in 0 of 30; the abort
depends on timing at exit, so this test cannot show it every time.)
"""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid

import pulsar
import pytest

from headrace.wal.pulsar.client import client_log_level

_SCRIPT = """
import logging, sys
from headrace.wal.pulsar import client
from headrace.wal.pulsar.settings import parse_settings

logging.getLogger("headrace.wal.pulsar").setLevel(logging.INFO)
settings = parse_settings({"service_url": sys.argv[1], "topic_prefix": sys.argv[2]})
pulsar_client = client.new_client(settings)
producer = pulsar_client.create_producer(settings.topic("p0"))
producer.send(b"record")
producer.close()
pulsar_client.close()
print("done", flush=True)
"""
RUNS = 12


def test_the_client_log_level_follows_the_python_logger() -> None:
    assert client_log_level(logging.DEBUG) == pulsar.LoggerLevel.Debug
    assert client_log_level(logging.INFO) == pulsar.LoggerLevel.Info
    assert client_log_level(logging.WARNING) == pulsar.LoggerLevel.Warn
    assert client_log_level(logging.ERROR) == pulsar.LoggerLevel.Error
    assert client_log_level(logging.NOTSET) == pulsar.LoggerLevel.Debug


@pytest.mark.pulsar
@pytest.mark.timeout(300)
def test_processes_using_the_backend_exit_cleanly(pulsar_url: str) -> None:
    prefix = f"headrace.exit-{uuid.uuid4().hex[:8]}."
    failures = []
    client_logs = []
    for run in range(RUNS):
        proc = subprocess.run(
            [sys.executable, "-c", _SCRIPT, pulsar_url, prefix],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if proc.returncode != 0 or proc.stdout.strip() != "done":
            failures.append((run, proc.returncode, proc.stderr.strip().splitlines()[-3:]))
        client_logs.append(" INFO " in proc.stderr and "ClientConnection" in proc.stderr)
    assert failures == [], f"{len(failures)} of {RUNS} runs did not exit cleanly: {failures}"
    # The library's INFO lines (enabled through the Python logger's level)
    # went to stderr; stdout carried only the script's own output.
    assert all(client_logs)
