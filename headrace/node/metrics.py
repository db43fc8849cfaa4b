"""A streaming node's metrics (see :mod:`headrace.metrics` for the conventions).

Two kinds, so the write path pays per request, never per message:

* **Events**, recorded where they happen: per produce request (messages,
  bytes, the request's size, its latency, failed messages by error code), per
  consume response (messages, bytes, how far behind the WAL's tail it was),
  and per WAL open and release (outcome, duration).
* **State**, read from the WALs the node holds when Prometheus scrapes
  (:class:`WALCollector`): term, state, buffer use, appended messages, open
  transactions, growing segments, failed opens.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from headrace import tso
from headrace.metrics import LATENCY_BUCKETS, SIZE_BUCKETS
from headrace.node.housekeeping import Housekeeper
from headrace.node.walmanager import WALManager
from headrace.wal.api import WALState

_STATES = tuple(state.value for state in WALState)


class NodeMetrics:
    """The event metrics of one node, in its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.append_messages = Counter(
            "headrace_append_messages", "Messages appended", ["pchannel"], registry=r
        )
        self.append_bytes = Counter(
            "headrace_append_bytes", "Bytes of produce requests appended", ["pchannel"], registry=r
        )
        self.append_failed = Counter(
            "headrace_append_failed_messages",
            "Messages not appended, by error code",
            ["pchannel", "code"],
            registry=r,
        )
        self.append_request_messages = Histogram(
            "headrace_append_request_messages",
            "Messages per produce request appended at once",
            ["pchannel"],
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.append_seconds = Histogram(
            "headrace_append_duration_seconds",
            "Time to append one produce request (all its batches)",
            ["pchannel"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.consumed_messages = Counter(
            "headrace_consume_messages", "Messages sent to consumers", ["pchannel"], registry=r
        )
        self.consumed_bytes = Counter(
            "headrace_consume_bytes", "Bytes of consume responses sent", ["pchannel"], registry=r
        )
        self.consume_lag_seconds = Histogram(
            "headrace_consume_lag_seconds",
            "How far the newest message of a consume response was behind the WAL's "
            "last timetick when it was sent (scanner lag)",
            ["pchannel"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.wal_opens = Counter(
            "headrace_wal_opens",
            "WAL opens by outcome (served, fenced, failed)",
            ["outcome"],
            registry=r,
        )
        self.wal_open_seconds = Histogram(
            "headrace_wal_open_duration_seconds",
            "Time to open a WAL (recovery included) that then served",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.wal_releases = Counter(
            "headrace_wal_releases",
            "WALs released, drained (handoff, shutdown) or not (fenced, replaced)",
            ["drained"],
            registry=r,
        )
        self.wal_release_seconds = Histogram(
            "headrace_wal_release_duration_seconds",
            "Time to release a WAL, its drain included",
            ["drained"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def watch(self, manager: WALManager) -> None:
        """Export the state of ``manager``'s WALs at each scrape."""
        self.registry.register(WALCollector(manager))

    def watch_housekeeping(self, housekeeper: Housekeeper) -> None:
        """Export what the housekeeping passes saw: flush lag, truncations."""
        self.registry.register(HousekeepingCollector(housekeeper))

    def appended(
        self, pchannel: str, *, messages: int, size: int, failed: dict[str, int], seconds: float
    ) -> None:
        self.append_messages.labels(pchannel).inc(messages - sum(failed.values()))
        self.append_bytes.labels(pchannel).inc(size)
        self.append_request_messages.labels(pchannel).observe(messages)
        self.append_seconds.labels(pchannel).observe(seconds)
        for code, count in failed.items():
            self.append_failed.labels(pchannel, code).inc(count)

    def consumed(self, pchannel: str, *, messages: int, size: int, newest: int, tail: int) -> None:
        """A consume response of ``messages`` whose newest timetick is ``newest``
        was sent while the WAL's last timetick was ``tail``."""
        self.consumed_messages.labels(pchannel).inc(messages)
        self.consumed_bytes.labels(pchannel).inc(size)
        self.consume_lag_seconds.labels(pchannel).observe(lag_seconds(newest, tail))

    # WALEvents of the WAL manager
    def opened(self, outcome: str, seconds: float) -> None:
        self.wal_opens.labels(outcome).inc()
        if outcome == "served":
            self.wal_open_seconds.observe(seconds)

    def released(self, drained: bool, seconds: float) -> None:
        label = "true" if drained else "false"
        self.wal_releases.labels(label).inc()
        self.wal_release_seconds.labels(label).observe(seconds)


def lag_seconds(newest: int, tail: int) -> float:
    """How far timetick ``newest`` is behind ``tail``, in seconds (pure)."""
    return max(0, tso.physical_ms(tail) - tso.physical_ms(newest)) / 1000.0


class WALCollector(Collector):
    """The state of the WALs a node holds, read at scrape time."""

    def __init__(self, manager: WALManager) -> None:
        self.manager = manager

    def collect(self) -> Iterator[Metric]:
        term = GaugeMetricFamily(
            "headrace_wal_term", "Term the WAL is held at", labels=["pchannel"]
        )
        state = GaugeMetricFamily(
            "headrace_wal_state", "1 for the WAL's current state", labels=["pchannel", "state"]
        )
        buffer_bytes = GaugeMetricFamily(
            "headrace_wal_buffer_bytes", "Write-ahead buffer use", labels=["pchannel"]
        )
        buffer_entries = GaugeMetricFamily(
            "headrace_wal_buffer_entries", "Entries in the write-ahead buffer", labels=["pchannel"]
        )
        appended = CounterMetricFamily(
            "headrace_wal_appended_messages",
            "Messages appended since the WAL was opened at its term",
            labels=["pchannel"],
        )
        txns = GaugeMetricFamily(
            "headrace_wal_open_transactions", "Transactions in flight", labels=["pchannel"]
        )
        segments = GaugeMetricFamily(
            "headrace_wal_growing_segments", "Growing segments of collections", labels=["pchannel"]
        )
        failures = GaugeMetricFamily(
            "headrace_wal_open_failures",
            "Failed opens in a row of a WAL this node should serve",
            labels=["pchannel"],
        )
        for pchannel, wal in sorted(self.manager.held.items()):
            stats = wal.stats()
            term.add_metric([pchannel], wal.term)
            for name in _STATES:
                state.add_metric([pchannel, name], 1.0 if wal.state.value == name else 0.0)
            for family, key in (
                (buffer_bytes, "buffer_bytes"),
                (buffer_entries, "buffer_entries"),
                (appended, "appended_total"),
                (txns, "open_txns"),
                (segments, "growing_segments"),
            ):
                value = stats.get(key)
                if isinstance(value, int | float):
                    family.add_metric([pchannel], value)
        for pchannel, failure in sorted(self.manager.failures.items()):
            failures.add_metric([pchannel], failure.attempts)
        yield from (term, state, buffer_bytes, buffer_entries, appended, txns, segments, failures)


class HousekeepingCollector(Collector):
    """Flush lag, unflushed bytes and truncations, as the last housekeeping
    pass of each pchannel this node serves saw them (every 10 s by default)."""

    def __init__(self, housekeeper: Housekeeper) -> None:
        self.housekeeper = housekeeper

    def collect(self) -> Iterator[Metric]:
        unflushed = GaugeMetricFamily(
            "headrace_wal_unflushed_bytes",
            "Bytes of collection data in the WAL past the flush checkpoint",
            labels=["pchannel"],
        )
        lag = GaugeMetricFamily(
            "headrace_flush_lag_seconds",
            "How far the flush checkpoint is behind the WAL's tail (0 when nothing is "
            "unflushed; absent before the first checkpoint)",
            labels=["pchannel"],
        )
        truncations = CounterMetricFamily(
            "headrace_wal_truncations",
            "Times this node truncated the pchannel's log below its retention bound",
            labels=["pchannel"],
        )
        held = self.housekeeper.manager.held
        for pchannel, kept in sorted(self.housekeeper.kept.items()):
            if pchannel not in held:
                continue
            unflushed.add_metric([pchannel], kept.unflushed_bytes)
            truncations.add_metric([pchannel], kept.truncations)
            if kept.checkpoint_timetick is not None:
                behind = (
                    lag_seconds(kept.checkpoint_timetick, kept.tail_timetick)
                    if kept.unflushed_bytes
                    else 0.0
                )
                lag.add_metric([pchannel], behind)
        yield from (unflushed, lag, truncations)
