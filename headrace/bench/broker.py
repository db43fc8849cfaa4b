"""Baselines of the WAL benchmark on Kafka and Pulsar: the raw client producer.

The baseline is what the broker's own client does with the same bytes on the
same broker: the same encoded 1 KiB messages, in batches of the same size, by
one producer with the WAL writer's own settings, minus what only the WAL needs.

* Kafka: a ``confluent_kafka.Producer`` with the writer's configuration
  (:func:`headrace.wal.kafka.writer.producer_config`: idempotent,
  ``acks=all``, the same ``linger.ms`` and size limits) but no
  ``transactional.id``: plain idempotent produce, no transactions, no
  record headers. This is the baseline the issue's targets are defined
  against (``ratio``, ``p99_overhead_ms``).
* Kafka, transactional (``RawRun.transactional``): the same producer *with*
  the writer's transactional settings under a ``transactional.id`` of its
  own (fresh per run, so nothing fences it), on its own fresh topic. After
  ``init_transactions()`` and one warm-up transaction (the writer's fence
  record is likewise written at open), every group of in-flight batches is
  exactly ``begin_transaction()``, the batches' ``produce()`` calls,
  ``commit_transaction()``, with no record headers. That is the least the
  broker needs for the fencing of a message format 1 log's writer (one
  transaction per backend append, so a new owner's ``init_transactions()``
  fences the old one); it pays the same AddPartitionsToTxn and EndTxn round
  trips as that writer. The WAL's ratio against it (``ratio_vs_txn``)
  isolates the WAL layer's own overhead (interceptors, encoding, term stamps,
  group commit, thread hand-offs) from the broker's transaction cost, which
  the non-transactional baseline does not pay. A format 2 log's writer
  (:mod:`headrace.wal.kafka.chain`) pays no transaction either.
* Pulsar: a producer with the writer's options
  (:func:`headrace.wal.pulsar.writer.producer_options`: the same queue and
  send timeout) with its own batching on (up to a batch's messages, published
  after at most 1 ms), in the default access mode, without message properties.

Pipelining is the same on both sides: ``inflight`` batches are outstanding at
any time. The WAL side runs ``inflight`` producers, each calling
``append_many`` with one batch and waiting for it (the WAL may merge what is
queued into one backend append, as the product does); the baseline keeps
``inflight`` batches in flight on its one producer and starts the next batch
as soon as one is fully acknowledged. A batch's latency is the time from its
first send to its last acknowledgement. The Kafka producer waits with
``flush()``, which sends at once regardless of ``linger.ms`` (as the writer's
commit does) and returns when everything in flight is acknowledged: its
batches go out in groups of up to ``inflight``, as the WAL's queued batches
share a transaction. (Waiting with ``poll()`` instead would add up to
``linger.ms`` to every round trip and make the baseline slower with two
batches in flight than with one.) The transactional baseline groups batches
the same way, one transaction per group of up to ``inflight`` batches, and
its ``commit_transaction()`` is the acknowledgement: a batch's latency runs
from its first send (for a group's first batch, from
``begin_transaction()``) until the commit returns.

Every blocking call runs in a worker thread, off the event loop. The
baseline's topics are fresh (``<pchannel>`` names from the benchmark) and are
left on the broker, like the WAL's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from headrace import errors
from headrace.bench import report
from headrace.wal.kafka.settings import KafkaSettings
from headrace.wal.kafka.settings import parse_settings as parse_kafka
from headrace.wal.pulsar.settings import PulsarSettings
from headrace.wal.pulsar.settings import parse_settings as parse_pulsar

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message, Producer

_WARMUP = b"headrace-bench-warmup"
_RAW_ONLY_KEYS = ("transactional.id", "transaction.timeout.ms")
Acked = Callable[[str | None], None]
"""Called once per acknowledged record, with the failure's text if it failed."""
Outcome = tuple[float, list[float]]
"""Messages per second, and each batch's latency in seconds."""
BROKERS = ("kafka", "pulsar")


def backend_settings(
    backend: str, kafka_bootstrap: str | None, pulsar_url: str | None
) -> dict[str, Any]:
    """Backend settings of a benchmark's command line; InvalidArgument if one is missing."""
    if backend == "kafka":
        if not kafka_bootstrap:
            raise errors.InvalidArgument("bench wal --backend kafka needs --kafka-bootstrap")
        return {"bootstrap_servers": kafka_bootstrap}
    if backend == "pulsar":
        if not pulsar_url:
            raise errors.InvalidArgument("bench wal --backend pulsar needs --pulsar-url")
        return {"service_url": pulsar_url}
    return {}


class Window:
    """Batches in flight, at most ``depth``; each batch's latency (thread-safe)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.latencies: list[float] = []
        self.failure: str | None = None
        self._outstanding = 0
        self._cond = threading.Condition()

    @property
    def outstanding(self) -> int:
        with self._cond:
            return self._outstanding

    def open(self, count: int) -> Acked:
        """A batch of ``count`` records starts now; call the result once per acknowledgement."""
        started = time.perf_counter()
        left = count
        with self._cond:
            self._outstanding += 1

        def acked(failure: str | None) -> None:
            nonlocal left
            with self._cond:
                if failure is not None and self.failure is None:
                    self.failure = failure
                left -= 1
                if left == 0:
                    self.latencies.append(time.perf_counter() - started)
                    self._outstanding -= 1
                    self._cond.notify_all()

        return acked

    def wait(self, limit: int, timeout: float) -> bool:
        """Wait until at most ``limit`` batches are outstanding; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._outstanding <= limit, timeout)


def _outcome(window: Window, count: int, elapsed: float, what: str) -> Outcome:
    if window.failure is not None:
        raise errors.Unavailable(f"{what}: a send failed: {window.failure}")
    return report.rate(count, elapsed), window.latencies


def _batches(records: list[bytes], batch: int) -> list[list[bytes]]:
    return [records[i : i + batch] for i in range(0, len(records), batch)]


def kafka_producer_config(settings: KafkaSettings, topic: str) -> dict[str, Any]:
    """The writer's producer configuration without its transactional keys."""
    from headrace.wal.kafka.writer import producer_config  # noqa: PLC0415

    config = producer_config(settings, topic)
    return {k: v for k, v in config.items() if k not in _RAW_ONLY_KEYS}


def kafka_txn_producer_config(
    settings: KafkaSettings, topic: str, transactional_id: str
) -> dict[str, Any]:
    """The writer's producer configuration, transactions included, under ``transactional_id``."""
    from headrace.wal.kafka.writer import producer_config  # noqa: PLC0415

    return {**producer_config(settings, topic), "transactional.id": transactional_id}


def transaction_groups(batches: list[list[bytes]], inflight: int) -> list[list[list[bytes]]]:
    """Consecutive groups of up to ``inflight`` batches: one transaction each."""
    if inflight < 1:
        raise errors.InvalidArgument("inflight must be positive")
    return [batches[i : i + inflight] for i in range(0, len(batches), inflight)]


def _produce(
    producer: Producer, topic: str, data: bytes, on_delivery: Callable[[Any, Any], None]
) -> None:
    """One record to partition 0, waiting for room in the producer's queue."""
    while True:
        try:
            producer.produce(topic, data, partition=0, on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(0.05)


class Delivered:
    """Delivery reports of the transactional baseline (served in its own thread)."""

    def __init__(self) -> None:
        self.ok = 0
        self.failure: str | None = None

    def __call__(self, err: KafkaError | None, _msg: object) -> None:
        if err is None:
            self.ok += 1
        elif self.failure is None:
            self.failure = err.str()

    def check(self, expected: int, what: str) -> None:
        """Unavailable unless exactly ``expected`` records were acknowledged."""
        if self.failure is not None or self.ok != expected:
            detail = self.failure or f"{self.ok} of {expected} records acknowledged"
            raise errors.Unavailable(f"{what}: a send failed or went unreported: {detail}")


def _transaction(
    producer: Producer,
    topic: str,
    group: list[list[bytes]],
    delivered: Delivered,
    timeout: float,
) -> list[float]:
    """begin, produce the group's batches, commit; each batch's latency (s)."""
    starts = [time.perf_counter()]
    producer.begin_transaction()
    for k, chunk in enumerate(group):
        if k:
            starts.append(time.perf_counter())
        for data in chunk:
            _produce(producer, topic, data, delivered)
    producer.commit_transaction(timeout)
    done = time.perf_counter()
    return [done - started for started in starts]


def _kafka_txn_loop(
    settings: KafkaSettings, topic: str, records: list[bytes], batch: int, depth: int
) -> Outcome:
    """The raw transactional producer loop (blocking)."""
    from confluent_kafka import KafkaException, Producer  # noqa: PLC0415

    from headrace.wal.kafka import client  # noqa: PLC0415

    timeout = settings.operation_timeout_s
    what = f"kafka transactional baseline producer on {topic}"
    txn_id = f"headrace-bench-txn-{secrets.token_hex(8)}"
    latencies: list[float] = []
    delivered = Delivered()
    try:
        producer = Producer(kafka_txn_producer_config(settings, topic, txn_id))
        producer.init_transactions(timeout)
        warm = Delivered()
        _transaction(producer, topic, [[_WARMUP]], warm, timeout)
        warm.check(1, f"{what} (warm-up)")
        start = time.perf_counter()
        for group in transaction_groups(_batches(records, batch), depth):
            latencies += _transaction(producer, topic, group, delivered, timeout)
        elapsed = time.perf_counter() - start
    except KafkaException as exc:
        raise client.translate_exception(exc, what, settings) from None
    delivered.check(len(records), what)
    return report.rate(len(records), elapsed), latencies


def _kafka_loop(
    settings: KafkaSettings, topic: str, records: list[bytes], batch: int, depth: int
) -> Outcome:
    """The raw producer loop (blocking)."""
    from confluent_kafka import KafkaException, Producer  # noqa: PLC0415

    from headrace.wal.kafka import client  # noqa: PLC0415

    timeout = settings.operation_timeout_s
    what = f"kafka baseline producer on {topic}"
    try:
        producer = Producer(kafka_producer_config(settings, topic))
        producer.produce(topic, _WARMUP, partition=0)
        if producer.flush(timeout) != 0:
            raise errors.Unavailable(f"{what}: the warm-up record was not acknowledged")
        window = Window(depth)

        def settle(limit: int) -> None:
            deadline = time.monotonic() + timeout
            while window.outstanding > limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise errors.Unavailable(f"{what}: no acknowledgement within {timeout} s")
                producer.flush(left)

        start = time.perf_counter()
        for chunk in _batches(records, batch):
            settle(depth - 1)
            acked = window.open(len(chunk))

            def delivered(err: KafkaError | None, _msg: Message, acked: Acked = acked) -> None:
                acked(None if err is None else err.str())

            for data in chunk:
                _produce(producer, topic, data, delivered)
        settle(0)
        elapsed = time.perf_counter() - start
    except KafkaException as exc:
        raise client.translate_exception(exc, what, settings) from None
    return _outcome(window, len(records), elapsed, what)


def _pulsar_loop(
    settings: PulsarSettings, topic: str, records: list[bytes], batch: int, depth: int
) -> Outcome:
    """The raw producer loop (blocking)."""
    import pulsar  # noqa: PLC0415

    from headrace.wal.pulsar import client  # noqa: PLC0415
    from headrace.wal.pulsar.writer import producer_options  # noqa: PLC0415

    timeout = settings.operation_timeout_s + settings.send_timeout_ms / 1000
    what = f"pulsar baseline producer on {topic}"
    pulsar_client = client.new_client(settings)
    try:
        options = producer_options(settings) | {
            "batching_enabled": True,
            "batching_max_messages": batch,
            "batching_max_publish_delay_ms": 1,
        }
        producer = pulsar_client.create_producer(topic, **options)
        producer.send(_WARMUP)
        window = Window(depth)
        ok = pulsar.Result.Ok
        start = time.perf_counter()
        for chunk in _batches(records, batch):
            if not window.wait(depth - 1, timeout):
                raise errors.Unavailable(f"{what}: no acknowledgement within {timeout} s")
            acked = window.open(len(chunk))

            def sent(result: Any, _mid: Any, acked: Acked = acked) -> None:
                acked(None if result == ok else str(result))

            for data in chunk:
                producer.send_async(data, sent)
        if not window.wait(0, timeout):
            raise errors.Unavailable(f"{what}: no acknowledgement within {timeout} s")
        elapsed = time.perf_counter() - start
        producer.close()
    except pulsar.PulsarException as exc:
        raise client.translate(exc, what, settings) from None
    finally:
        pulsar_client.close()
    return _outcome(window, len(records), elapsed, what)


@dataclasses.dataclass(frozen=True)
class RawRun:
    """One baseline run: the backend's keyword settings and a fresh pchannel name.

    ``transactional`` (Kafka only) runs the transactional baseline.
    """

    backend: str
    settings: Mapping[str, Any]
    pchannel: str
    batch: int
    inflight: int
    transactional: bool = False


def _run(run: RawRun, records: list[bytes]) -> Outcome:
    if run.backend == "kafka":
        from headrace.wal.kafka import client  # noqa: PLC0415

        kafka = parse_kafka(run.settings)
        topic = kafka.topic(run.pchannel)
        client.ensure_topic(client.new_admin(kafka), kafka, topic)
        loop = _kafka_txn_loop if run.transactional else _kafka_loop
        return loop(kafka, topic, records, run.batch, run.inflight)
    if run.backend == "pulsar":
        pulsar = parse_pulsar(run.settings)
        topic = pulsar.topic(run.pchannel)
        return _pulsar_loop(pulsar, topic, records, run.batch, run.inflight)
    raise errors.InvalidArgument(f"no raw producer baseline for backend {run.backend!r}")


async def raw_producer(run: RawRun, records: list[bytes]) -> Outcome:
    """Messages per second of the raw client producer, and each batch's latency (s)."""
    if min(run.batch, run.inflight) < 1:
        raise errors.InvalidArgument("batch and inflight must be positive")
    if run.transactional and run.backend != "kafka":
        raise errors.InvalidArgument(
            f"the transactional producer baseline is Kafka's only, not {run.backend!r}'s"
        )
    return await asyncio.to_thread(_run, run, records)


def describe(backend: str, batch: int, inflight: int) -> str:
    """One line naming the baseline, for the benchmark's output."""
    client = (
        "confluent_kafka.Producer (the writer's configuration without transactions)"
        if backend == "kafka"
        else "pulsar producer (the writer's options, its own batching on)"
    )
    return f"{client}; {inflight} batch(es) of {batch} in flight"


def describe_txn(batch: int, inflight: int) -> str:
    """One line naming Kafka's transactional baseline, for the benchmark's output."""
    return (
        "confluent_kafka.Producer (the writer's configuration, its own transactional.id); "
        f"one transaction per {inflight} batch(es) of {batch}"
    )
