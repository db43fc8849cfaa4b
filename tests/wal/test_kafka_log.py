"""librdkafka's log lines in the backend's log: the known warning about a setting the
backend makes on purpose does not repeat at WARNING on every take of a topic; every
other warning still does (no broker needed: the lines come when a client is made)."""

from __future__ import annotations

import logging

import pytest

from headrace.wal.kafka.settings import parse_settings

pytestmark = pytest.mark.timeout(60)

GAPLESS = "enable.gapless.guarantee is experimental"


def _lines(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "headrace.wal.kafka" and r.levelno == level and text in r.getMessage()
    ]


def test_the_chained_producers_known_warning_is_not_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from headrace.wal.kafka.chain import chained_producer  # noqa: PLC0415

    settings = parse_settings({"bootstrap_servers": "127.0.0.1:9", "kafka.fetch.wait.max.ms": 7})
    with caplog.at_level(logging.DEBUG, logger="headrace.wal.kafka"):
        for _ in range(3):  # one per take of the topic
            producer = chained_producer(settings)
            producer.poll(0.2)  # serves the client's log lines
            producer.flush(0)
    assert not _lines(caplog, logging.WARNING, GAPLESS)
    assert len(_lines(caplog, logging.DEBUG, GAPLESS)) == 3, "still there, at DEBUG"
    # Another configuration warning (a consumer property given to a producer) stays one.
    assert len(_lines(caplog, logging.WARNING, "fetch.wait.max.ms")) == 3


def test_library_levels() -> None:
    from headrace.wal.kafka.client import library_level  # noqa: PLC0415

    gapless = (
        "CONFWARN",
        "rdkafka#producer-3",
        "[thrd:app]: Configuration property enable.gapless.guarantee is experimental: ...",
    )
    assert library_level(logging.WARNING, gapless) == logging.DEBUG
    other = ("CONFWARN", "rdkafka#producer-3", "[thrd:app]: Configuration property x is ...")
    assert library_level(logging.WARNING, other) == logging.WARNING
    # The known text under another facility, or as an error, is not demoted.
    assert library_level(logging.WARNING, ("FAIL", *gapless[1:])) == logging.WARNING
    assert library_level(logging.ERROR, gapless) == logging.ERROR
    assert library_level(logging.WARNING, ()) == logging.WARNING
