"""Kafka's chained writer (message format 2 logs): fencing by where records land.

The pure decisions (delivery reports, which records count) without a broker;
then, on a real broker, a fenced writer whose pipelined records straddle the
new owner's fence record, readers and the recovery reads (last record,
earliest) skipping a fenced writer's records, and the transactional writer
kept for message format 1 logs.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from headrace import errors
from headrace.message.ids import MessageID
from headrace.wal import registry
from headrace.wal.brokers.stamps import FOREIGN, Kind, Stamp
from headrace.wal.contract import BackendWriter, Record, StartPosition
from headrace.wal.groupcommit import GroupCommit, PartlyWritten
from headrace.wal.iothread import IOThread, call_job
from headrace.wal.kafka.fencing import (
    Admission,
    KafkaStamp,
    Placed,
    chained_header,
    decode_placed,
    header,
)
from headrace.wal.kafka.message_id import KafkaMessageID

pytestmark = pytest.mark.timeout(180)

T1: KafkaStamp = Stamp(Kind.DATA, 1, 11)
T2: KafkaStamp = Stamp(Kind.DATA, 2, 22)
FENCE_1: KafkaStamp = Stamp(Kind.FENCE, 1, 11)
FENCE_2: KafkaStamp = Stamp(Kind.FENCE, 2, 22, KafkaMessageID(1))


# ---- pure ------------------------------------------------------------------------------


def test_settle_acknowledges_only_records_in_place() -> None:
    from headrace.wal.kafka.chain import Verdict, settle  # noqa: PLC0415

    assert settle(5, 3, [(5, ""), (6, ""), (7, "")]).offsets == [5, 6, 7]
    displaced = settle(5, 3, [(5, ""), (7, ""), (8, "")])
    assert (displaced.offsets, displaced.verdict) == ([5], Verdict.DISPLACED)
    first_out = settle(5, 2, [(6, ""), (7, "")])
    assert (first_out.offsets, first_out.verdict) == ([], Verdict.DISPLACED)
    failed = settle(5, 3, [(5, ""), (None, "Local: Message timed out")])
    assert (failed.offsets, failed.verdict) == ([5], Verdict.UNKNOWN)
    assert "timed out" in failed.detail
    missing = settle(5, 3, [(5, ""), (6, "")])
    assert (missing.offsets, missing.verdict) == ([5, 6], Verdict.UNKNOWN)
    fence = settle(None, 1, [(40, "")])
    assert (fence.offsets, fence.verdict) == ([40], Verdict.STORED)


def _counted(records: list[tuple[int, Placed]], admission: Admission | None = None) -> list[int]:
    admission = admission or Admission()
    counted = []
    for offset, placed in records:
        admission, counts = admission.after(offset, placed)
        if counts:
            counted.append(offset)
    return counted


def test_admission_skips_a_fenced_writers_records() -> None:
    log = [
        (0, Placed(FENCE_1)),
        (1, Placed(T1, 1)),  # acknowledged before the new fence record: counts
        (2, Placed(FENCE_2)),
        (3, Placed(T1, 2)),  # pipelined behind it, out of place
        (4, Placed(T1, 4)),  # in place, but of a term the fence record fenced
        (5, Placed(T1)),  # a transactional record of the fenced term
        (6, Placed(Stamp(Kind.DATA, 2, 99), 6)),  # the fence record's term, another writer
        (7, Placed(Stamp(Kind.FENCE, 1, 5))),  # a late lower-term fence record
        (8, Placed(T2, 8)),
        (9, Placed(FOREIGN)),  # another producer's record
        (10, Placed(T2, 9)),  # the owner's record, out of place after it
    ]
    assert _counted(log) == [0, 1, 2, 8, 9]


def test_admission_from_the_middle_keeps_out_of_place_records_out() -> None:
    """A reader that starts after the fence record knows no owner yet."""
    assert _counted([(3, Placed(T1, 2)), (4, Placed(T2, 4)), (5, Placed(T2, 6))]) == [4]


def test_admission_keeps_a_reacquiring_writer() -> None:
    """A writer that takes its topic back writes a new fence record of its own."""
    log = [
        (0, Placed(FENCE_1)),
        (1, Placed(T1, 1)),
        (2, Placed(Stamp(Kind.FENCE, 0, 5))),  # a stale lower-term opener
        (3, Placed(T1, 2)),
        (4, Placed(FENCE_1)),
        (5, Placed(T1, 5)),
    ]
    assert _counted(log) == [0, 1, 4, 5]


def test_chained_header_round_trips() -> None:
    [(_, value)] = chained_header(T2, 1234)
    assert isinstance(value, bytes)
    assert decode_placed(value) == Placed(T2, 1234)
    [(_, plain)] = header(T2)
    assert isinstance(plain, bytes)
    assert decode_placed(plain) == Placed(T2)
    with pytest.raises(errors.CorruptData):
        decode_placed(value[:-8] + (-5).to_bytes(8, "big", signed=True))


def test_the_chained_producer_never_leaves_a_gap() -> None:
    """Its records land without gaps or not at all (a record after a refused one
    would land where a newer fence record may lie), and a client setting cannot
    turn that off."""
    from headrace.wal.kafka.settings import parse_settings  # noqa: PLC0415

    settings = parse_settings({"bootstrap_servers": "127.0.0.1:9", "kafka.message.timeout.ms": 5})
    config = settings.idempotent_producer_config()
    assert config["enable.gapless.guarantee"] is True
    assert config["message.timeout.ms"] == 0
    with pytest.raises(errors.InvalidArgument, match=r"enable\.gapless\.guarantee"):
        parse_settings({"bootstrap_servers": "127.0.0.1:9", "kafka.enable.gapless.guarantee": 0})


def test_message_format_picks_the_writer() -> None:
    from headrace.wal.kafka.backend import chained_for  # noqa: PLC0415

    assert not chained_for(1)
    assert chained_for(2)


async def test_a_partly_written_group_acknowledges_the_calls_stored() -> None:
    """Calls whose records were all stored before the writer was fenced succeed."""
    import concurrent.futures  # noqa: PLC0415

    fenced = errors.Fenced("term 1 is fenced", term=1, current_term=2)
    release = concurrent.futures.Future[None]()

    def write(batch: list[bytes]) -> list[MessageID]:
        if batch == [b"x"]:
            release.result(10)
            return [KafkaMessageID(1)]
        assert batch == [b"a", b"b1", b"b2"]
        raise PartlyWritten(fenced, [KafkaMessageID(2), KafkaMessageID(3)])

    thread: IOThread[Callable[[], None]] = IOThread("test-writer", call_job)
    try:
        group = GroupCommit(write, thread)
        first = group.start([b"x"])
        a, b = group.start([b"a"]), group.start([b"b1", b"b2"])
        release.set_result(None)
        assert await first == [KafkaMessageID(1)]
        assert await a == [KafkaMessageID(2)]
        with pytest.raises(errors.Fenced):
            await b
        with pytest.raises(errors.Fenced):
            await group.start([b"later"])
    finally:
        thread.stop()


# ---- a real broker -----------------------------------------------------------------------


@pytest.fixture
async def kafka(kafka_bootstrap: str) -> AsyncIterator[Any]:
    backend = registry.create(
        "kafka",
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=f"chain.{uuid.uuid4().hex[:12]}.",
        operation_timeout_s=30.0,
    )
    try:
        yield backend
    finally:
        await backend.close()


async def _read_all(backend: Any, pchannel: str, start: StartPosition) -> list[Record]:
    """Everything readable from ``start`` (until a read finds nothing for a while)."""
    reader = await backend.open_reader(pchannel, start)
    records: list[Record] = []
    try:
        while batch := await reader.next_batch(100, timeout=2.0):
            records += batch
    finally:
        await reader.close()
    return records


class _Interposer:
    """The chained links' producers; before producing ``trigger``, the records produced
    so far are flushed and ``hook`` runs (in the writer's thread, also if the flush
    raises)."""

    def __init__(self, trigger: bytes) -> None:
        self.trigger = trigger
        self.hook: Callable[[], None] | None = None

    def producer(self, config: dict[str, Any]) -> Any:
        from confluent_kafka import Producer  # noqa: PLC0415

        interposer = self
        inner = Producer(config)

        class Proxy:
            def __getattr__(self, name: str) -> Any:
                return getattr(inner, name)

            def produce(self, topic: str, value: bytes, **kwargs: Any) -> None:
                hook = interposer.hook
                if value == interposer.trigger and hook is not None:
                    interposer.hook = None
                    try:
                        left = inner.flush(30.0)
                    finally:  # also when the flush raises (the producer stopped)
                        hook()
                    assert left == 0
                inner.produce(topic, value, **kwargs)

        return Proxy()


@pytest.mark.kafka
async def test_new_fence_record_between_pipelined_records_of_the_old_writer(
    kafka: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two appends of term 1 go out in one send; term 2's fence record lands between
    their records. The first is acknowledged and read; the second fails fenced and is
    never read, although it is stored (after the fence record)."""
    from headrace.wal.kafka import chain  # noqa: PLC0415

    interposer = _Interposer(b"t1-straddled")
    monkeypatch.setattr(chain, "Producer", interposer.producer)
    loop = asyncio.get_running_loop()
    old = await kafka.open_writer_for("p", 1, 2)
    [first] = await old.append([b"t1-first"])
    opened: list[BackendWriter] = []

    def open_new() -> None:
        future = asyncio.run_coroutine_threadsafe(kafka.open_writer_for("p", 2, 2), loop)
        opened.append(future.result(60))

    busy = old.start_append([b"t1-busy"])
    acked = old.start_append([b"t1-acked"])
    straddled = old.start_append([b"t1-straddled"])
    interposer.hook = open_new
    [busy_id] = await busy
    [acked_id] = await acked
    with pytest.raises(errors.Fenced) as fenced:
        await straddled
    assert fenced.value.current_term == 2
    with pytest.raises(errors.Fenced):
        await old.append([b"t1-after"])
    [new] = opened

    # Recovery reads: the straddled record is the topic's last, and does not count.
    last = await kafka.last_record("p")
    assert last == Record(acked_id, b"t1-acked")
    [new_id] = await new.append([b"t2-first"])
    records = await _read_all(kafka, "p", StartPosition.earliest())
    assert [r.data for r in records] == [b"t1-first", b"t1-busy", b"t1-acked", b"t2-first"]
    assert [r.id for r in records] == [first, busy_id, acked_id, new_id]
    after = await _read_all(kafka, "p", StartPosition.after(acked_id))
    assert [r.data for r in after] == [b"t2-first"]
    await old.close()
    await new.close()


def _produce_log(backend: Any, pchannel: str, records: list[tuple[bytes, Any]]) -> list[int]:
    """Produce ``(value, headers)`` records in order, one at a time; their offsets."""
    from confluent_kafka import Producer  # noqa: PLC0415

    producer = Producer(backend.settings.idempotent_producer_config())
    offsets: list[int] = []
    for value, headers in records:
        producer.produce(
            backend.settings.topic(pchannel),
            value,
            partition=0,
            headers=headers,
            on_delivery=lambda err, msg: offsets.append(msg.offset()),
        )
        assert producer.flush(30.0) == 0
    return offsets


@pytest.mark.kafka
async def test_readers_and_recovery_skip_a_fenced_writers_records(kafka: Any) -> None:
    """A log as two chained writers and a transactional zombie can leave it."""
    assert await kafka.earliest("q") is None  # creates the topic
    log = [
        (b"", header(FENCE_1)),
        (b"a", chained_header(T1, 1)),
        (b"", header(Stamp(Kind.FENCE, 2, 22, KafkaMessageID(1)))),
        (b"zombie-out-of-place", chained_header(T1, 2)),
        (b"zombie-in-place", chained_header(T1, 4)),
        (b"zombie-transactional", header(T1)),
        (b"b", chained_header(T2, 6)),
        (b"zombie-last", chained_header(T1, 7)),
    ]
    offsets = await asyncio.to_thread(_produce_log, kafka, "q", log)
    assert offsets == list(range(8)), f"the topic was not fresh: {offsets}"

    records = await _read_all(kafka, "q", StartPosition.earliest())
    assert [(r.id, r.data) for r in records] == [
        (KafkaMessageID(1), b"a"),
        (KafkaMessageID(6), b"b"),
    ]
    assert [r.data for r in await _read_all(kafka, "q", StartPosition.after(records[0].id))] == [
        b"b"
    ]
    assert await kafka.last_record("q") == Record(KafkaMessageID(6), b"b")
    assert await kafka.earliest("q") == KafkaMessageID(1)
    with pytest.raises(errors.Fenced):
        await kafka.open_writer_for("q", 1, 2)
    writer = await kafka.open_writer_for("q", 3, 2)
    [c] = await writer.append([b"c"])
    assert [r.data for r in await _read_all(kafka, "q", StartPosition.earliest())] == [
        b"a",
        b"b",
        b"c",
    ]
    assert await kafka.last_record("q") == Record(c, b"c")
    await writer.close()


@pytest.mark.kafka
@pytest.mark.parametrize(("message_format", "step"), [(1, 2), (2, 1)])
async def test_format_1_logs_keep_transactions(kafka: Any, message_format: int, step: int) -> None:
    """A transaction's commit marker takes an offset after each append; a chained
    writer's records follow each other."""
    writer = await kafka.open_writer_for(f"f{message_format}", 1, message_format)
    [one] = await writer.append([b"one"])
    [two] = await writer.append([b"two"])
    assert two.offset - one.offset == step
    await writer.close()


@pytest.mark.kafka
async def test_the_switch_to_format_2_fences_the_transactional_writer(kafka: Any) -> None:
    """A format 1 (transactional) writer still open when a format 2 writer takes over
    can commit nothing more: the take fences its producer epoch."""
    old = await kafka.open_writer_for("s", 1, 1)
    await old.append([b"format-1"])
    new = await kafka.open_writer_for("s", 2, 2)
    with pytest.raises(errors.Fenced):
        await old.append([b"after-the-switch"])
    await new.append([b"format-2"])
    records = await _read_all(kafka, "s", StartPosition.earliest())
    assert [r.data for r in records] == [b"format-1", b"format-2"]
    await old.close()
    await new.close()


class _FailingReport:
    """The chained links' producers; the delivery report of ``value`` says it failed
    (the record itself is produced: its fate is what the writer cannot know)."""

    def __init__(self, value: bytes) -> None:
        self.value = value

    def producer(self, config: dict[str, Any]) -> Any:
        from confluent_kafka import KafkaError, Producer  # noqa: PLC0415

        failing = self.value
        inner = Producer(config)

        class Proxy:
            def __getattr__(self, name: str) -> Any:
                return getattr(inner, name)

            def produce(self, topic: str, value: bytes, **kwargs: Any) -> None:
                report = kwargs.pop("on_delivery")
                if value == failing:

                    def failed(err: Any, msg: Any) -> None:
                        report(KafkaError(KafkaError._MSG_TIMED_OUT), msg)

                    kwargs["on_delivery"] = failed
                else:
                    kwargs["on_delivery"] = report
                inner.produce(topic, value, **kwargs)

        return Proxy()


@pytest.mark.kafka
async def test_an_append_whose_delivery_is_unknown_is_settled_by_taking_the_topic_again(
    kafka: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed delivery report is never taken for an acknowledgement: the writer
    takes the topic again behind a new fence record, which settles the send; the
    records found in place before it are acknowledged with their real ids (and
    not sent again), so readers read each once."""
    from headrace.wal.kafka import chain  # noqa: PLC0415

    monkeypatch.setattr(chain, "Producer", _FailingReport(b"unknown").producer)
    writer = await kafka.open_writer_for("u", 1, 2)
    [before] = await writer.append([b"before"])
    unknown = await writer.append([b"unknown", b"unknown-too"])
    [after] = await writer.append([b"after"])
    assert after.offset > unknown[-1].offset + 1  # the new fence record lies between
    records = await _read_all(kafka, "u", StartPosition.earliest())
    assert [r.data for r in records] == [b"before", b"unknown", b"unknown-too", b"after"]
    assert [r.id for r in records] == [before, *unknown, after]
    await writer.close()


@pytest.mark.kafka
async def test_an_unknown_delivery_that_cannot_be_settled_is_never_reported_fenced(
    kafka: Any, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The send's delivery is unknown and, before the writer takes the topic again, a
    newer term's fence record lands: the records may be stored (here they are, in
    place before it, so readers read them), so the append fails Unavailable, not
    Fenced (which would say they were not stored); the next append is Fenced."""
    from confluent_kafka import Producer  # noqa: PLC0415

    from headrace.wal.brokers.stamps import Kind, Stamp  # noqa: PLC0415
    from headrace.wal.kafka import chain  # noqa: PLC0415
    from headrace.wal.kafka.fencing import header  # noqa: PLC0415

    monkeypatch.setattr(chain, "Producer", _FailingReport(b"unknown").producer)
    takes = 0
    take = chain.ChainLink.take

    def take_after_a_newer_term(link: Any) -> None:
        nonlocal takes
        takes += 1
        if takes == 2:  # the take that would settle the unknown send
            raw = Producer({"bootstrap.servers": kafka_bootstrap})
            raw.produce(link.topic, b"", partition=0, headers=header(Stamp(Kind.FENCE, 2, 7)))
            assert raw.flush(30.0) == 0
        take(link)

    monkeypatch.setattr(chain.ChainLink, "take", take_after_a_newer_term)
    writer = await kafka.open_writer_for("n", 1, 2)
    await writer.append([b"before"])
    with pytest.raises(errors.Unavailable, match="delivery is unknown") as failed:
        await writer.append([b"unknown"])
    assert not isinstance(failed.value, errors.Fenced)
    with pytest.raises(errors.Fenced):
        await writer.append([b"after"])
    records = await _read_all(kafka, "n", StartPosition.earliest())
    assert [r.data for r in records] == [b"before", b"unknown"]
    await writer.close()


@pytest.mark.kafka
@pytest.mark.parametrize(
    ("delay", "client"),
    [
        pytest.param(0.0, {}, id="0"),
        pytest.param(0.02, {}, id="0.02"),
        pytest.param(0.05, {}, id="0.05"),
        pytest.param(0.0, {"batch.num.messages": 1}, id="0-one-record-batches"),
        pytest.param(0.02, {"batch.num.messages": 1}, id="0.02-one-record-batches"),
    ],
)
async def test_a_racing_takeover_loses_no_acknowledged_append(
    kafka_bootstrap: str, delay: float, client: dict[str, Any]
) -> None:
    """Eight appenders of term 1 keep appending (their appends share sends) while
    term 2 opens: exactly the term 1 appends that were acknowledged are read, then
    term 2's. With one record per produce request, term 2's fence record can land
    inside a send, between two appends of it (a record batch lands whole)."""
    kafka = registry.create(
        "kafka",
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=f"chain.{uuid.uuid4().hex[:12]}.",
        operation_timeout_s=30.0,
        kafka=client,
    )
    old = await kafka.open_writer_for("r", 1, 2)
    acked: list[bytes] = []
    refused: list[bytes] = []

    async def appender(k: int) -> None:
        for i in itertools.count():  # until fenced: a cap could be reached before the take
            data = f"t1-{k}-{i}".encode()
            try:
                await old.append([data])
            except errors.Fenced:
                refused.append(data)
                return
            acked.append(data)

    appenders = [asyncio.create_task(appender(k)) for k in range(8)]
    await asyncio.sleep(delay)
    new = await kafka.open_writer_for("r", 2, 2)
    await asyncio.wait_for(asyncio.gather(*appenders), 60)
    await new.append([b"t2"])
    assert len(refused) == 8
    records = await _read_all(kafka, "r", StartPosition.earliest())
    read = [r.data for r in records]
    assert read[-1] == b"t2"
    assert sorted(read[:-1]) == sorted(acked)
    assert not set(refused) & set(read)
    await old.close()
    await new.close()
    await kafka.close()


class _LateLanding:
    """The chained links' producers; the first record whose value holds each of
    ``late`` is not produced when sent (its delivery report fails: the append's
    outcome is unknown) but lands, in the order sent, just before the next fence
    record any chained link produces: after that writer's last look at the topic's
    end, as records of the dropped producer still in flight can."""

    def __init__(self, late: set[bytes]) -> None:
        self.late = set(late)
        self.held: list[tuple[str, bytes, Any]] = []

    def land(self, config: dict[str, Any]) -> None:
        from confluent_kafka import Producer  # noqa: PLC0415

        held, self.held = self.held, []
        if not held:
            return
        producer = Producer(config)
        for topic, value, headers in held:
            producer.produce(topic, value, partition=0, headers=headers)
        assert producer.flush(30.0) == 0

    def producer(self, config: dict[str, Any]) -> Any:
        from confluent_kafka import KafkaError, Producer  # noqa: PLC0415

        late = self
        inner = Producer(config)

        class NoOffset:
            def offset(self) -> None:
                return None

        class Proxy:
            def __getattr__(self, name: str) -> Any:
                return getattr(inner, name)

            def produce(self, topic: str, value: bytes, **kwargs: Any) -> None:
                headers = kwargs["headers"]
                marker = next((m for m in late.late if m in value), None)
                if marker is not None:
                    late.late.discard(marker)
                    late.held.append((topic, value, headers))
                    kwargs["on_delivery"](KafkaError(KafkaError._MSG_TIMED_OUT), NoOffset())
                    return
                if decode_placed(headers[0][1]).stamp.kind is Kind.FENCE:
                    late.land(config)
                inner.produce(topic, value, **kwargs)

        return Proxy()


@pytest.mark.kafka
@pytest.mark.parametrize("openers", [1, 10])
async def test_records_landing_between_the_look_and_the_fence_record_stay_last(
    kafka: Any, monkeypatch: pytest.MonkeyPatch, openers: int
) -> None:
    """An append fails with its delivery unknown; its records land in place after the
    next opener's look at the end, just before that opener's fence record, so the
    fence record's pointer names an older data record. They are read, so the last
    record (what a new writer recovers from: its last position and timetick, the
    dedup window up to it) is theirs, also behind further openers' fence records."""
    from headrace.wal.kafka import chain  # noqa: PLC0415

    late = _LateLanding({b"late-1", b"late-2"})
    monkeypatch.setattr(chain, "Producer", late.producer)
    pchannel = f"late{openers}"
    old = await kafka.open_writer_for(pchannel, 1, 2)
    await old.append([b"before"])
    # The writer's own take settles the send: the records land before its fence
    # record, after its look, and are acknowledged.
    landed = await old.append([b"late-1", b"late-2"])
    writers = [await kafka.open_writer_for(pchannel, 2 + k, 2) for k in range(openers)]
    records = await _read_all(kafka, pchannel, StartPosition.earliest())
    assert [r.data for r in records] == [b"before", b"late-1", b"late-2"]
    assert [r.id for r in records[1:]] == landed
    assert await kafka.last_record(pchannel) == records[-1]
    [after] = await writers[-1].append([b"after"])
    assert await kafka.last_record(pchannel) == Record(after, b"after")
    for writer in [old, *writers]:
        await writer.close()


@pytest.mark.kafka
async def test_records_after_one_the_broker_refused_never_follow_a_newer_fence_record(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker refuses a record of term 1 (the topic's limit is lower than the
    writer's) and term 2's fence record takes its place. Term 1's producer must not
    go on with the records after the refused one (a gap in its series): they would
    land where they name, after the fence record, and with eight of them the end of
    the topic (what a look reads) would be term 1's, so the fenced writer would take
    the topic back and acknowledge appends that readers skip."""
    from headrace.wal.kafka import chain  # noqa: PLC0415

    prefix = f"chain.{uuid.uuid4().hex[:12]}."

    def backend(limit: int) -> Any:
        return registry.create(
            "kafka",
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=prefix,
            operation_timeout_s=30.0,
            max_message_bytes=limit,
        )

    smaller = backend(2000)
    assert await smaller.earliest("g") is None  # creates the topic with the lower limit
    await smaller.close()
    kafka = backend(8000)
    interposer = _Interposer(b"z0")
    monkeypatch.setattr(chain, "Producer", interposer.producer)
    loop = asyncio.get_running_loop()
    old = await kafka.open_writer_for("g", 1, 2)
    await old.append([b"t1-first"])
    opened: list[BackendWriter] = []

    def open_new() -> None:
        future = asyncio.run_coroutine_threadsafe(kafka.open_writer_for("g", 2, 2), loop)
        opened.append(future.result(60))

    interposer.hook = open_new
    zombies = [f"z{i}".encode() for i in range(9)]
    with pytest.raises(errors.Unavailable):
        await old.append([b"x" * 3000, *zombies])
    [new] = opened
    acked = [b"t1-first"]
    try:
        await old.append([b"t1-after"])
        acked.append(b"t1-after")
    except errors.Fenced:
        pass
    await new.append([b"t2"])
    read = [r.data for r in await _read_all(kafka, "g", StartPosition.earliest())]
    assert read == [*acked, b"t2"]
    assert acked == [b"t1-first"]
    await old.close()
    await new.close()
    await kafka.close()


@pytest.mark.kafka
async def test_a_record_too_large_once_framed_is_refused_before_it_is_sent(
    kafka_bootstrap: str,
) -> None:
    """A record that fits the limit alone but not with its batch framing and stamp
    header is MessageTooLarge (not retryable), not an Unavailable from the broker's
    refusal; the largest record the check lets through is stored."""
    from headrace.wal.kafka import chain  # noqa: PLC0415

    limit = 2000
    kafka = registry.create(
        "kafka",
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=f"chain.{uuid.uuid4().hex[:12]}.",
        operation_timeout_s=30.0,
        max_message_bytes=limit,
    )
    writer = await kafka.open_writer_for("m", 1, 2)
    for size in (limit - 100, limit - 70):
        with pytest.raises(errors.MessageTooLarge):
            await writer.append([b"x" * size])
    largest = b"x" * (limit - chain.HEADER_ROOM)
    [stored] = await writer.append([largest])
    assert await _read_all(kafka, "m", StartPosition.earliest()) == [Record(stored, largest)]
    await writer.close()
    await kafka.close()


@pytest.mark.kafka
async def test_readers_from_the_middle_skip_the_fenced_writers_records(kafka: Any) -> None:
    """Readers that start after term 2's fence record (at a zombie record itself,
    after a term 2 record, at a truncation point) never read it, so only the
    chained rule (a record not where it names) keeps term 1's late records out."""
    assert await kafka.earliest("mid") is None  # creates the topic
    log = [
        (b"", header(FENCE_1)),
        (b"a", chained_header(T1, 1)),
        (b"", header(Stamp(Kind.FENCE, 2, 22, KafkaMessageID(1)))),
        (b"b", chained_header(T2, 3)),
        (b"zombie-1", chained_header(T1, 2)),  # term 1's pipelined records, late
        (b"zombie-2", chained_header(T1, 3)),
        (b"", header(Stamp(Kind.FENCE, 2, 22, KafkaMessageID(3)))),  # term 2 again
        (b"c", chained_header(T2, 7)),
    ]
    offsets = await asyncio.to_thread(_produce_log, kafka, "mid", log)
    assert offsets == list(range(8)), f"the topic was not fresh: {offsets}"
    b, c = KafkaMessageID(3), KafkaMessageID(7)

    async def read(start: StartPosition) -> list[bytes]:
        return [r.data for r in await _read_all(kafka, "mid", start)]

    assert await read(StartPosition.earliest()) == [b"a", b"b", b"c"]
    assert await read(StartPosition.at(KafkaMessageID(4))) == [b"c"]
    assert await read(StartPosition.at(KafkaMessageID(5))) == [b"c"]
    assert await read(StartPosition.after(b)) == [b"c"]
    await kafka.truncate("mid", KafkaMessageID(4))
    assert await read(StartPosition.earliest()) == [b"c"]
    assert await kafka.earliest("mid") == c
    assert await kafka.last_record("mid") == Record(c, b"c")


@pytest.mark.kafka
async def test_a_retry_of_an_append_that_landed_late_is_not_written_twice(
    kafka: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A WAL's append has its delivery unknown; its record lands in place just before
    the fence record of the writer's take that settles it, so the append succeeds. A
    client's retry (same producer id and sequence) gets the stored copy and writes
    nothing, on the same WAL and on the next owner's (which rebuilds its dedup window
    up to the last record)."""
    from headrace.message.types import Message, MessageType  # noqa: PLC0415
    from headrace.tso import LocalTSO  # noqa: PLC0415
    from headrace.wal.framework import WAL, WALOptions  # noqa: PLC0415
    from headrace.wal.kafka import chain  # noqa: PLC0415

    def produced(payload: bytes, seq: int) -> Message:
        return Message(
            MessageType.INSERT, "v", payload, {"producer_id": "prod", "producer_seq": str(seq)}
        )

    monkeypatch.setattr(chain, "Producer", _LateLanding({b"landed-late"}).producer)
    options = WALOptions(timetick_interval_ms=3_600_000, message_format=2)
    wal1 = await WAL.open(kafka, "w", 1, tso=LocalTSO(), options=options)
    await wal1.append(produced(b"first", 1))
    # Settled by the writer's own take: acknowledged, so the retry on the same WAL
    # is a duplicate its dedup window knows, and the next owner's window too.
    landed = await wal1.append(produced(b"landed-late", 2))
    assert (await wal1.append(produced(b"landed-late", 2))).id == landed.id
    wal2 = await WAL.open(kafka, "w", 2, tso=LocalTSO(), options=options)
    await wal2.append(produced(b"landed-late", 2))
    records = await _read_all(kafka, "w", StartPosition.earliest())
    assert sum(b"landed-late" in r.data for r in records) == 1
    await wal2.close()
    await wal1.close()


class _FencedOnce:
    """The chained links' producers; the first flush of a send of ``value`` raises the
    library's fenced-epoch error (the records stay unsent)."""

    def __init__(self, value: bytes) -> None:
        self.value: bytes | None = value

    def producer(self, config: dict[str, Any]) -> Any:
        from confluent_kafka import KafkaError, KafkaException, Producer  # noqa: PLC0415

        owner = self
        inner = Producer(config)

        class Proxy:
            armed = False

            def __getattr__(self, name: str) -> Any:
                return getattr(inner, name)

            def produce(self, topic: str, value: bytes, **kwargs: Any) -> None:
                if value == owner.value:
                    owner.value = None
                    Proxy.armed = True
                    return
                inner.produce(topic, value, **kwargs)

            def flush(self, timeout: float) -> int:
                if Proxy.armed:
                    Proxy.armed = False
                    raise KafkaException(KafkaError(KafkaError.INVALID_PRODUCER_EPOCH))
                return int(inner.flush(timeout))

        return Proxy()


@pytest.mark.kafka
async def test_a_fenced_epoch_of_the_chained_producer_is_not_taken_for_a_higher_term(
    kafka: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chained producer has no transactional id, so no other writer fences its
    epoch: a fenced-epoch error from the client fails the append Unavailable, and
    the next append looks at the topic's terms (its own: it goes on) rather than
    the writer calling itself fenced for good."""
    from headrace.wal.kafka import chain  # noqa: PLC0415

    monkeypatch.setattr(chain, "Producer", _FencedOnce(b"epoch").producer)
    writer = await kafka.open_writer_for("e", 1, 2)
    [before] = await writer.append([b"before"])
    with pytest.raises(errors.Unavailable) as failed:
        await writer.append([b"epoch"])
    assert not isinstance(failed.value, errors.Fenced)
    [after] = await writer.append([b"after"])
    records = await _read_all(kafka, "e", StartPosition.earliest())
    assert records == [Record(before, b"before"), Record(after, b"after")]
    await writer.close()


@pytest.mark.kafka
async def test_the_switch_to_format_2_settles_an_open_transaction(
    kafka: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A format 1 writer's transaction is open (its records produced, not committed)
    when a format 2 writer of a higher term takes the topic: the take aborts it, so
    the append fails Fenced and none of its records is ever read."""
    from confluent_kafka import Producer  # noqa: PLC0415

    from headrace.wal.kafka import writer as transactional  # noqa: PLC0415

    loop = asyncio.get_running_loop()
    opened: list[BackendWriter] = []

    def open_new() -> None:
        future = asyncio.run_coroutine_threadsafe(kafka.open_writer_for("o", 2, 2), loop)
        opened.append(future.result(60))

    hooks: list[Callable[[], None]] = []

    def producer(config: dict[str, Any]) -> Any:
        inner = Producer(config)

        class Proxy:
            def __getattr__(self, name: str) -> Any:
                return getattr(inner, name)

            def commit_transaction(self, timeout: float) -> None:
                inner.flush(timeout)  # the records are stored, uncommitted
                if hooks:
                    hooks.pop()()
                inner.commit_transaction(timeout)

        return Proxy()

    monkeypatch.setattr(transactional, "Producer", producer)
    old = await kafka.open_writer_for("o", 1, 1)
    await old.append([b"format-1"])
    hooks.append(open_new)
    with pytest.raises(errors.Fenced):
        await old.append([b"in-the-open-transaction"])
    [new] = opened
    await new.append([b"format-2"])
    records = await _read_all(kafka, "o", StartPosition.earliest())
    assert [r.data for r in records] == [b"format-1", b"format-2"]
    await old.close()
    await new.close()
