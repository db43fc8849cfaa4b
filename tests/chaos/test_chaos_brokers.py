"""Short chaos runs on the broker backends: node processes on Kafka and on Pulsar.

The same workload and checks as the local run of ``test_chaos_short``: kills,
pauses and moves while producers and consumers run, and the broker itself
stalled for seconds and restarted; then exactly-once order
of every acknowledged message and a clean WAL (no stale term after a fence, no
timetick regression). Each run gets pchannel names of its own, so its topics
are new even on a broker that earlier runs wrote to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from headrace.bench import chaos
from headrace.bench.broker_faults import BrokerControl
from headrace.bench.procs import BROKER_FAULT_KINDS, FaultTimings
from headrace.message.types import LogEntry, Message, MessageType
from headrace.wal.local.message_id import LocalMessageID
from tests.chaos.checks import assert_clean

_FAULT_SECONDS = 22.0


def test_broker_runs_get_pchannel_names_of_their_own() -> None:
    assert chaos.pchannel_prefix("local") == "chaos"
    first, second = chaos.pchannel_prefix("kafka"), chaos.pchannel_prefix("kafka")
    assert first.startswith("chaos-") and second.startswith("chaos-") and first != second
    assert chaos.pchannel_prefix("pulsar") != chaos.pchannel_prefix("pulsar")


def _insert(lsn: int, tick: int, payload: bytes, term: int = 1) -> LogEntry:
    return LogEntry(
        LocalMessageID(lsn), Message(MessageType.INSERT, "v", payload, timetick=tick, term=term)
    )


def test_records_stored_twice_are_told_apart_from_other_regressions() -> None:
    # A resend of records 2 and 3 after their acknowledgements were lost.
    resent = [_insert(1, 10, b"v:1"), _insert(2, 11, b"v:2"), _insert(3, 12, b"v:3")]
    resent += [_insert(4, 11, b"v:2"), _insert(5, 12, b"v:3"), _insert(6, 13, b"v:4")]
    assert chaos.audit_log(resent)["timetick_regressions"] == 2
    assert chaos.count_rewritten(resent) == 2
    # Same payload, new timetick: a second append, not a rewrite.
    appended_again = [_insert(1, 10, b"v:1"), _insert(2, 11, b"v:1")]
    assert chaos.count_rewritten(appended_again) == 0
    # A regression with a record never seen before is not a rewrite either.
    regressed = [_insert(1, 10, b"v:1"), _insert(2, 9, b"v:2"), _insert(3, 9, b"v:2", term=2)]
    assert chaos.audit_log(regressed)["timetick_regressions"] == 2
    assert chaos.count_rewritten(regressed) == 0


_BROKERS = {
    "kafka": ("kafka_bootstrap", "bootstrap_servers"),
    "pulsar": ("pulsar_url", "service_url"),
}
"""Per broker: the fixture giving its address and the backend setting it fills."""


_STALL_THEN_RESTART = FaultTimings(broker_gap_s=(1.0, 3.0), broker_stall_s=(3.0, 5.0))
"""A stall, then a restart, both started within the short run (after the
first round of node faults)."""
_RUNS = [
    pytest.param("kafka", BROKER_FAULT_KINDS, marks=pytest.mark.kafka, id="kafka"),
    pytest.param("pulsar", ("broker_stall",), marks=pytest.mark.pulsar, id="pulsar-stall"),
    pytest.param("pulsar", BROKER_FAULT_KINDS, marks=pytest.mark.pulsar, id="pulsar-restart"),
]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("backend", "broker_kinds"), _RUNS)
async def test_short_chaos_on_a_broker(
    tmp_path: Path,
    backend: str,
    broker_kinds: tuple[str, ...],
    request: pytest.FixtureRequest,
    broker_control: Callable[[str], BrokerControl],
) -> None:
    """Node faults, and the broker itself stalled (SIGSTOP) and restarted."""
    fixture, setting = _BROKERS[backend]
    address = request.getfixturevalue(fixture)
    faults = dataclasses.replace(_STALL_THEN_RESTART, broker_kinds=broker_kinds)
    result = await chaos.run_chaos(
        tmp_path,
        _FAULT_SECONDS,
        seed=20261122,
        backend=backend,
        backend_settings={setting: address},
        timings=chaos.ChaosTimings(faults=faults),
        broker=broker_control(backend),
    )
    # A move needs an assigned pchannel: a broker restart (up to a minute here)
    # can withhold every assignment for the whole short run, so moves are not
    # required; the kills, pauses and the broker's own faults are.
    # The log holds each record once: what the Pulsar client resends after a
    # stalled connection is dropped by the broker's deduplication.
    assert_clean(result, ("kill", "stop", *broker_kinds))
