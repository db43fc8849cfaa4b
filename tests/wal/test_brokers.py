"""The broker toolkit (headrace.wal.brokers) on an in-memory broker.

The same checks run against the real brokers in ``test_broker_parts.py``; the
backends' own behaviour on real brokers is the conformance suite's,
``test_stale_writer_brokers.py``'s and ``test_pulsar_fence_order.py``'s.
"""

from __future__ import annotations

import asyncio

import pytest

from headrace import errors
from headrace.message import batch
from headrace.message.batch import BatchInfo, Stamped
from headrace.message.types import Message, MessageType
from headrace.wal.brokers.contract import End, end_of
from headrace.wal.brokers.plumbing import Plumbing, check_term, expect_id
from headrace.wal.brokers.reader import POLL_S, BrokerReader, fetch_wait
from headrace.wal.brokers.registration import register_lazily
from headrace.wal.brokers.stamps import Kind, Stamp, fence_check, overtaken
from headrace.wal.brokers.testing import check_parts
from headrace.wal.brokers.writer import MAX_REACQUIRE, BrokerWriter, unsent
from headrace.wal.contract import StartPosition
from headrace.wal.kafka.message_id import KafkaMessageID
from headrace.wal.memory.message_id import MemoryMessageID

from .brokerfakes import FakeLibraryError, FakeLink, FakeSource, FakeTopic, Translations, fake_parts

# ---- the framework itself ------------------------------------------------------------


def test_the_fake_broker_passes_the_checks() -> None:
    check_parts(fake_parts())


def test_the_checks_catch_a_source_that_shows_fence_records() -> None:
    class Leaky(FakeSource):
        def fetch(self, max_records: int, wait_s: float) -> list:  # type: ignore[type-arg]
            records = super().fetch(max_records, wait_s)
            return records + records[:1]

    parts = fake_parts()
    topics: dict[str, FakeTopic] = {}
    broken = type(parts)(
        link=lambda p: FakeLink(topics.setdefault(p, FakeTopic()), p),
        source=lambda p, start: Leaky(topics.setdefault(p, FakeTopic()), start),
        boundary=parts.boundary,
        library_error=parts.library_error,
    )
    with pytest.raises(AssertionError):
        check_parts(broken)


def test_the_checks_catch_a_link_whose_take_fences_nobody() -> None:
    class Shared(FakeLink):
        def send(self, records, stamp):  # type: ignore[no-untyped-def]
            self._epoch = self._topic.epoch
            return super().send(records, stamp)

    parts = fake_parts()
    topics: dict[str, FakeTopic] = {}
    broken = type(parts)(
        link=lambda p: Shared(topics.setdefault(p, FakeTopic()), p),
        source=lambda p, start: FakeSource(topics.setdefault(p, FakeTopic()), start),
        boundary=parts.boundary,
        library_error=parts.library_error,
    )
    with pytest.raises(AssertionError, match="did not raise Lost"):
        check_parts(broken)


# ---- pure decisions ------------------------------------------------------------------


def _data(term: int, nonce: int) -> Stamp[MemoryMessageID]:
    return Stamp(Kind.DATA, term, nonce)


def test_fence_decisions() -> None:
    assert fence_check("p", 3, 1, None, reacquire=False) is None
    assert fence_check("p", 3, 1, _data(2, 9), reacquire=True) is None
    assert fence_check("p", 3, 1, _data(3, 9), reacquire=False) is None
    assert fence_check("p", 3, 1, _data(3, 1), reacquire=True) is None
    same_term_other_writer = fence_check("p", 3, 1, _data(3, 9), reacquire=True)
    assert isinstance(same_term_other_writer, errors.Fenced)
    higher = fence_check("p", 3, 1, _data(4, 1), reacquire=False)
    assert isinstance(higher, errors.Fenced)
    assert (higher.term, higher.current_term) == (3, 4)


def test_overtaken_points_the_restore_record_at_the_last_data_record() -> None:
    m = MemoryMessageID
    before = [(m(3), _data(5, 50)), (m(4), Stamp(Kind.FENCE, 6, 60, m(3))), (m(5), _data(2, 2))]
    found = overtaken("p", 4, 40, before, m(2), reacquire=False)
    assert found is not None and found.fenced.current_term == 6
    assert found.restore == Stamp(Kind.FENCE, 6, 60, m(5))
    assert overtaken("p", 7, 70, before, m(2), reacquire=False) is None


def test_fetch_waits_at_most_one_poll_and_never_past_the_deadline() -> None:
    assert fetch_wait(None, 100.0) == POLL_S
    assert fetch_wait(100.05, 100.0) == pytest.approx(0.05)
    assert fetch_wait(101.0, 100.0) == POLL_S
    assert fetch_wait(99.0, 100.0) == 0.0


def test_unsent_is_what_follows_the_stored_prefix() -> None:
    batch = [b"a", b"b", b"c"]
    assert unsent(batch, []) == batch
    assert unsent(batch, [MemoryMessageID(1), MemoryMessageID(2)]) == [b"c"]


def test_terms_and_ids_are_checked() -> None:
    assert check_term(0) == 0
    for bad in (-1, True, 1.5, 1 << 63, "1"):
        with pytest.raises(errors.InvalidArgument):
            check_term(bad)
    assert expect_id(KafkaMessageID(3), KafkaMessageID) == KafkaMessageID(3)
    with pytest.raises(errors.InvalidArgument, match="expected a kafka message id"):
        expect_id(MemoryMessageID(3), KafkaMessageID)


# ---- the writer ----------------------------------------------------------------------


async def _writer(
    topic: FakeTopic, term: int, translations: Translations | None = None
) -> BrokerWriter[MemoryMessageID]:
    boundary = (translations or Translations()).boundary
    writer = BrokerWriter(FakeLink(topic, "p"), term, boundary)
    await writer.open()
    return writer


def _kinds(topic: FakeTopic) -> list[tuple[Kind, int, bytes]]:
    return [(stamp.kind, stamp.term, data) for _, stamp, data in topic.records]


async def test_open_fences_and_appends_carry_the_term() -> None:
    topic = FakeTopic()
    writer = await _writer(topic, 4)
    ids = await writer.append([b"a", b"b"])
    assert ids == [MemoryMessageID(2), MemoryMessageID(3)]
    assert _kinds(topic) == [(Kind.FENCE, 4, b""), (Kind.DATA, 4, b"a"), (Kind.DATA, 4, b"b")]
    await writer.close()
    with pytest.raises(errors.Closed):
        await writer.append([b"c"])


async def test_a_lower_term_interloper_is_taken_back_from() -> None:
    topic = FakeTopic()
    writer = await _writer(topic, 7)
    await writer.append([b"before"])
    FakeLink(topic, "p").take()
    await writer.append([b"after"])
    assert [d for k, _, d in _kinds(topic) if k is Kind.DATA] == [b"before", b"after"]
    assert topic.takes == 3
    await writer.close()


async def test_a_higher_term_fences_the_writer_for_good() -> None:
    topic = FakeTopic()
    old = await _writer(topic, 1)
    new = await _writer(topic, 2)
    with pytest.raises(errors.Fenced) as fenced:
        await old.append([b"stale"])
    assert fenced.value.current_term == 2
    takes = topic.takes
    with pytest.raises(errors.Fenced):
        await old.append([b"stale-again"])
    assert topic.takes == takes
    with pytest.raises(errors.Fenced):
        await _writer(topic, 1)
    await new.append([b"fine"])
    await old.close()
    await new.close()


async def test_a_send_fenced_midway_sends_only_the_rest() -> None:
    topic = FakeTopic()
    writer = await _writer(topic, 3)
    topic.fence_after = 2
    ids = await writer.append([b"1", b"2", b"3", b"4"])
    data = [(mid, d) for mid, stamp, d in topic.records if stamp.kind is Kind.DATA]
    assert [d for _, d in data] == [b"1", b"2", b"3", b"4"]
    assert ids == [mid for mid, _ in data]
    await writer.close()


async def test_records_stored_without_their_receipts_are_not_sent_again() -> None:
    topic = FakeTopic()
    writer = await _writer(topic, 3)
    topic.fence_after, topic.receipts_lost = 2, 1
    ids = await writer.append([b"1", b"2", b"3", b"4"])
    data = [(mid, d) for mid, stamp, d in topic.records if stamp.kind is Kind.DATA]
    assert [d for _, d in data] == [b"1", b"2", b"3", b"4"]
    assert ids == [mid for mid, _ in data]
    await writer.close()


def _stamped(tag: bytes, timetick: int, term: int) -> tuple[Stamped, bytes]:
    """A producer's record batch with a stamp not joined yet, and its stamped bytes."""
    msgs = [Message(MessageType.INSERT, "v", tag + b"%d" % i) for i in range(3)]
    data = batch.encode(msgs, BatchInfo("v"))
    return Stamped(data, batch.verify(data).with_stamp(timetick, term)), batch.stamped(
        data, timetick, term
    )


async def test_a_stamped_batch_is_sent_joined_and_the_caller_keeps_it_unjoined() -> None:
    # The write-ahead buffer keeps the Stamped: a copy joined on the event loop
    # and kept would page-fault in fresh memory for every batch (issue #14).
    topic = FakeTopic()
    writer = await _writer(topic, 2)
    first, first_bytes = _stamped(b"a", 10, 2)
    second, second_bytes = _stamped(b"b", 20, 2)
    producers = first.records
    ids = await writer.start_append_stamped([first, b"plain", second])
    data = [(mid, d) for mid, stamp, d in topic.records if stamp.kind is Kind.DATA]
    assert data == list(zip(ids, [first_bytes, b"plain", second_bytes], strict=True))
    assert first.records is producers, "the caller's batch was not joined"
    assert first.parts() != (first_bytes,)
    await writer.close()


async def test_a_stamped_batch_whose_send_is_fenced_midway_is_sent_whole_after_the_take() -> None:
    topic = FakeTopic()
    writer = await _writer(topic, 3)
    records = [_stamped(b"%d" % i, 10 * i, 3) for i in range(1, 4)]
    topic.fence_after = 1
    ids = await writer.start_append_stamped([stamped for stamped, _ in records])
    data = [(mid, d) for mid, stamp, d in topic.records if stamp.kind is Kind.DATA]
    assert data == list(zip(ids, [joined for _, joined in records], strict=True))
    assert topic.takes == 2, "the writer took its topic back once"
    await writer.close()


async def test_a_mutable_record_changed_after_its_append_starts_changes_nothing_stored() -> None:
    topic = FakeTopic()
    writer = await _writer(topic, 1)
    record = bytearray(b"original")
    pending = writer.start_append([record])
    record[:] = b"reused!!"  # the caller reuses its buffer before the send
    await pending
    assert [d for k, _, d in _kinds(topic) if k is Kind.DATA] == [b"original"]
    await writer.close()


async def test_a_writer_that_keeps_losing_gives_up() -> None:
    class Unlucky(FakeLink):
        def send(self, records, stamp):  # type: ignore[no-untyped-def]
            if stamp.kind is Kind.DATA:
                self._topic.epoch += 1
            return super().send(records, stamp)

    topic = FakeTopic()
    writer = BrokerWriter(Unlucky(topic, "p"), 1, Translations().boundary)
    await writer.open()
    with pytest.raises(errors.Unavailable, match=f"gave up after {MAX_REACQUIRE}"):
        await writer.append([b"x"])
    await writer.close()


async def test_an_opener_overtaken_by_a_higher_term_in_flight_is_fenced() -> None:
    topic = FakeTopic(verifies=True)
    first = await _writer(topic, 1)
    await first.append([b"a"])
    topic.land_before_fence = [(Stamp(Kind.DATA, 5, 55), b"in-flight")]
    with pytest.raises(errors.Fenced) as fenced:
        await _writer(topic, 2)
    assert fenced.value.current_term == 5
    restore = topic.records[-1]
    assert restore[1] == Stamp(Kind.FENCE, 5, 55, topic.records[-3][0])
    with pytest.raises(errors.Fenced):
        await _writer(topic, 4)
    await first.close()


async def test_without_read_back_the_in_flight_record_is_not_checked() -> None:
    topic = FakeTopic(verifies=False)
    topic.land_before_fence = [(Stamp(Kind.DATA, 5, 55), b"in-flight")]
    writer = await _writer(topic, 2)
    await writer.append([b"b"])
    await writer.close()


async def test_a_library_error_is_translated_once() -> None:
    topic = FakeTopic()
    translations = Translations()
    writer = await _writer(topic, 1, translations)
    topic.send_error = FakeLibraryError("broker went away")
    with pytest.raises(errors.Unavailable, match=r"fake appending to fake\.p: broker went away"):
        await writer.append([b"x"])
    assert translations.count == 1
    topic.send_error = errors.MessageTooLarge("too large")
    with pytest.raises(errors.MessageTooLarge):
        await writer.append([b"x"])
    assert translations.count == 1
    await writer.close()


async def test_a_failed_open_releases_the_link() -> None:
    topic = FakeTopic()
    await _writer(topic, 9)
    link = FakeLink(topic, "p")
    with pytest.raises(errors.Fenced):
        await BrokerWriter(link, 1, Translations().boundary).open()
    assert link.released


# ---- the reader ----------------------------------------------------------------------


async def test_reader_reads_waits_and_closes() -> None:
    topic = FakeTopic()
    writer = await _writer(topic, 1)
    ids = await writer.append([b"a", b"b"])
    source = FakeSource(topic, StartPosition.earliest())
    reader = BrokerReader(source, "p", Translations().boundary)
    await reader.open()
    assert [r.id for r in await reader.next_batch(10)] == ids
    assert await reader.next_batch(10, timeout=0.05) == []
    with pytest.raises(errors.InvalidArgument):
        await reader.next_batch(0)
    waiting = asyncio.ensure_future(reader.next_batch(10))
    await asyncio.sleep(0.05)
    await reader.close()
    with pytest.raises(errors.Closed):
        await waiting
    assert source.released
    with pytest.raises(errors.Closed):
        await reader.next_batch(10)
    await writer.close()


async def test_reader_errors_are_translated_once_and_a_failed_open_releases() -> None:
    translations = Translations()
    source = FakeSource(FakeTopic(), StartPosition.earliest())
    reader = BrokerReader(source, "p", translations.boundary)
    await reader.open()
    source.fetch_error = FakeLibraryError("gone")
    with pytest.raises(errors.Unavailable, match=r"fake reading fake\.p: gone"):
        await reader.next_batch(1)
    source.fetch_error = errors.Truncated("truncated away")
    with pytest.raises(errors.Truncated):
        await reader.next_batch(1)
    assert translations.count == 1
    await reader.close()

    failing = FakeSource(FakeTopic(), StartPosition.earliest())
    failing.open_error = FakeLibraryError("refused")
    with pytest.raises(errors.Unavailable, match="opening a reader"):
        await BrokerReader(failing, "p", translations.boundary).open()
    assert failing.released


# ---- plumbing and registration -------------------------------------------------------


async def test_topics_are_prepared_once_and_a_failure_is_not_remembered() -> None:
    calls: list[str] = []
    failures = [FakeLibraryError("not yet")]

    def prepare(pchannel: str) -> None:
        calls.append(pchannel)
        if failures:
            raise failures.pop()

    plumbing = Plumbing(Translations().boundary, prepare)
    with pytest.raises(errors.Unavailable, match="preparing the topics of p0"):
        await plumbing.prepare("p0")
    await plumbing.prepare("p0")
    await plumbing.prepare("p0")
    await plumbing.prepare("p1")
    assert calls == ["p0", "p0", "p1"]
    await plumbing.close()
    with pytest.raises(errors.Closed):
        await plumbing.prepare("p2")


async def test_plumbing_opens_prepared_clients_and_closes_them_before_releasing() -> None:
    prepared: list[str] = []
    plumbing = Plumbing(Translations().boundary, prepared.append)
    topic = FakeTopic()
    with pytest.raises(errors.InvalidArgument):
        await plumbing.open_writer("p", -1, lambda: FakeLink(topic, "p"))
    assert prepared == []
    writer = await plumbing.open_writer("p", 1, lambda: FakeLink(topic, "p"))
    await writer.append([b"x"])
    source = FakeSource(topic, StartPosition.earliest())
    reader = await plumbing.open_reader("p", lambda: source)
    assert [r.data for r in await reader.next_batch(10)] == [b"x"]
    assert prepared == ["p"]
    order: list[str] = []
    await plumbing.close(lambda: order.append("released"))
    assert source.released and order == ["released"]
    with pytest.raises(errors.Closed):
        await writer.append([b"y"])
    with pytest.raises(errors.Closed):
        await reader.next_batch(1)
    await plumbing.close(lambda: order.append("again"))
    assert order == ["released"]


def test_lazy_registration_names_what_to_install() -> None:
    from headrace.wal import registry  # noqa: PLC0415

    factory = register_lazily("nowhere", "headrace.wal.no_such_backend", "nothing (pip install x)")
    try:
        with pytest.raises(errors.InvalidArgument, match=r"needs nothing \(pip install x\)"):
            registry.create("nowhere")
        with pytest.raises(errors.InvalidArgument):
            factory()
    finally:
        registry._FACTORIES.pop("nowhere", None)


def test_the_end_follows_a_fence_record_to_the_last_data_record() -> None:
    m = MemoryMessageID
    assert end_of(m(4), _data(1, 1)) == End(_data(1, 1), m(4))
    fence = Stamp(Kind.FENCE, 2, 2, m(3))
    assert end_of(m(4), fence) == End(fence, m(3))
    assert end_of(m(1), Stamp(Kind.FENCE, 2, 2)) == End(Stamp(Kind.FENCE, 2, 2), None)
