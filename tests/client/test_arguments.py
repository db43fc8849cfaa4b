"""Wrong arguments to the public client API fail at once with InvalidArgument.

Not as an AttributeError or TypeError from deep inside, and without echoing
a huge value whole.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from headrace import errors
from headrace.client import HeadraceClient, ProducerOptions
from headrace.client.sync import SyncClient
from headrace.message.types import Message, MessageType
from headrace.wal.api import AppendResult
from tests.node.harness import HANG_GUARD, Cluster

HUGE = "v" * 10_000


def assert_clear(exc: errors.InvalidArgument, *words: str) -> None:
    text = str(exc)
    assert text.startswith("INVALID_ARGUMENT: "), text
    assert len(text) < 300, f"{len(text)} characters: {text[:100]}..."
    for word in words:
        assert word in text, text


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda p: p.send(123, b"x"), ["vchannel", "str", "int"]),
        (lambda p: p.send(None, b"x"), ["vchannel", "str"]),
        (lambda p: p.send(b"bytes-name", b"x"), ["vchannel", "str", "bytes"]),
        (lambda p: p.send("", b"x"), ["vchannel"]),
        (lambda p: p.send(HUGE, b"x"), ["vchannel", "10000 bytes"]),
        (lambda p: p.send("a b", b"x"), ["vchannel", "'a b'"]),
        (lambda p: p.send("a", "text"), ["payload", "bytes", "encode"]),
        (lambda p: p.send("a", 5), ["payload", "int"]),
        (lambda p: p.send("a", None), ["payload"]),
        (lambda p: p.send("a", b"x", type="nonsense"), ["message type", "nonsense"]),
        (lambda p: p.send("a", b"x", type=MessageType.TIME_TICK), ["TIME_TICK", "WAL"]),
        (lambda p: p.send("a", b"x", type=1.5), ["type", "float"]),
        (lambda p: p.send("a", b"x", properties=["k"]), ["properties", "mapping"]),
        (lambda p: p.send("a", b"x", properties={"k": 1}), ["properties", "str"]),
        (lambda p: p.send("a", b"x", properties={2: "v"}), ["properties", "str"]),
        (lambda p: p.send("a", b"x", txn_id=-1), ["txn_id"]),
        (lambda p: p.send("a", b"x", txn_id="7"), ["txn_id", "str"]),
        (lambda p: p.send_many(5), ["messages", "iterable"]),
        (lambda p: p.send_many(Message(MessageType.INSERT, "a")), ["messages", "iterable"]),
    ],
)
async def test_producer_rejects_bad_arguments(
    served: Cluster,
    client: HeadraceClient,
    call: Callable[[Any], Awaitable[object]],
    words: list[str],
) -> None:
    async with client.producer() as producer:
        with pytest.raises(errors.InvalidArgument) as caught:
            async with asyncio.timeout(HANG_GUARD):
                await call(producer)
        assert_clear(caught.value, *words)
        # The producer still works afterwards.
        assert isinstance(await producer.send("a", b"fine"), AppendResult)


async def test_send_many_fails_only_the_bad_messages(
    served: Cluster, client: HeadraceClient
) -> None:
    batch: list[Any] = [
        Message(MessageType.INSERT, "mixed", b"0"),
        "not a message",
        Message(MessageType.INSERT, 42, b"x"),  # type: ignore[arg-type]
        Message(MessageType.INSERT, "mixed", "text"),  # type: ignore[arg-type]
        Message(MessageType.FENCE, "mixed", b"x"),
        Message(MessageType.INSERT, "mixed", bytearray(b"1")),  # type: ignore[arg-type]
    ]
    async with client.producer() as producer:
        outcomes = await producer.send_many(batch)
    assert isinstance(outcomes[0], AppendResult) and isinstance(outcomes[5], AppendResult)
    expected = (["Message", "str"], ["vchannel", "int"], ["payload"], ["FENCE"])
    for outcome, words in zip(outcomes[1:5], expected, strict=True):
        assert isinstance(outcome, errors.InvalidArgument), outcome
        assert_clear(outcome, *words)
    consumer = client.consume("mixed")
    got = [await consumer.next(HANG_GUARD) for _ in range(2)]
    assert [e.message.payload for e in got if e is not None] == [b"0", b"1"]
    await consumer.close()


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda c: c.consume(7), ["vchannel", "int"]),
        (lambda c: c.consume(HUGE), ["vchannel", "10000 bytes"]),
        (lambda c: c.consume("a", start="middle"), ["start", "middle"]),
        (lambda c: c.consume("a", start=3), ["start"]),
        (lambda c: c.consume("a", types=[2.0]), ["types", "MessageType", "float"]),
        (lambda c: c.consume("a", types=[99]), ["message type", "99"]),
        (lambda c: c.consume("a", types="INSERT"), ["types", "collection"]),
        (lambda c: c.consume("a", types=MessageType.INSERT), ["types", "collection"]),
        (lambda c: c.consume("a", options={"ready_timeout": 1}), ["options", "ConsumerOptions"]),
        (lambda c: c.producer(options={"deadline": 1}), ["options", "ProducerOptions"]),
        (lambda c: c.route(None), ["vchannel", "NoneType"]),
    ],
)
async def test_client_rejects_bad_arguments(
    served: Cluster, client: HeadraceClient, call: Callable[[Any], object], words: list[str]
) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        call(client)
    assert_clear(caught.value, *words)


async def test_wait_ready_and_next_reject_bad_arguments(
    served: Cluster, client: HeadraceClient
) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        await client.wait_ready(5)  # type: ignore[arg-type]
    assert_clear(caught.value, "pchannel", "int")
    with pytest.raises(errors.InvalidArgument) as caught:
        await client.wait_ready("pchannel-000", timeout="soon")  # type: ignore[arg-type]
    assert_clear(caught.value, "timeout", "soon")
    consumer = client.consume("a")
    with pytest.raises(errors.InvalidArgument) as caught:
        await consumer.next("1")  # type: ignore[arg-type]
    assert_clear(caught.value, "timeout")
    for limit, words in ((0, ["limit", "at least 1"]), ("9", ["limit", "str"])):
        with pytest.raises(errors.InvalidArgument) as caught:
            await consumer.next_many(limit)  # type: ignore[arg-type]
        assert_clear(caught.value, *words)
    await consumer.close()


async def test_next_many_takes_what_was_received_in_order_up_to_its_limit(
    served: Cluster, client: HeadraceClient
) -> None:
    """One vchannel's messages sent alongside another's: the consumer
    takes only its own, in order, ``limit`` at most per call, and an empty list
    once nothing more arrives."""
    async with client.producer() as producer:
        outcomes = await producer.send_many(
            [Message(MessageType.INSERT, v, f"{v}{i}".encode()) for i in range(12) for v in "xy"]
        )
    assert all(isinstance(o, AppendResult) for o in outcomes)
    consumer = client.consume("x", start="earliest")
    taken: list[list[bytes]] = []
    while sum(map(len, taken)) < 12:
        entries = await consumer.next_many(5, timeout=HANG_GUARD)
        assert entries, "the messages sent were not delivered"
        taken.append([e.message.payload for e in entries])
    assert all(1 <= len(part) <= 5 for part in taken)
    assert [p for part in taken for p in part] == [f"x{i}".encode() for i in range(12)]
    assert await consumer.next_many(timeout=0.3) == []
    await consumer.close()


async def test_client_constructor_rejects_bad_arguments(served: Cluster) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        HeadraceClient(5)  # type: ignore[arg-type]
    assert_clear(caught.value, "metastore_url", "int")
    with pytest.raises(errors.InvalidArgument) as caught:
        HeadraceClient(served.url, cluster=None)  # type: ignore[arg-type]
    assert_clear(caught.value, "cluster", "NoneType")
    with pytest.raises(errors.InvalidArgument) as caught:
        HeadraceClient(served.url, options=ProducerOptions())  # type: ignore[arg-type]
    assert_clear(caught.value, "options", "ClientOptions")


async def test_sync_client_rejects_bad_arguments(served: Cluster) -> None:
    def work() -> list[errors.InvalidArgument]:
        caught = []
        with SyncClient(served.url, "test") as client:
            for call in (
                lambda: client.produce(HUGE, b"x"),
                lambda: client.produce("a", "text"),  # type: ignore[arg-type]
                lambda: list(client.consume(3, max_messages=1)),  # type: ignore[arg-type]
                lambda: client.produce_many(7),  # type: ignore[arg-type]
                lambda: list(client.consume("a", max_messages="2")),  # type: ignore[arg-type]
                lambda: list(client.consume("a", idle_timeout=-1)),
            ):
                with pytest.raises(errors.InvalidArgument) as exc:
                    call()
                caught.append(exc.value)
        return caught

    caught = await asyncio.to_thread(work)
    expected = (
        ["vchannel", "10000 bytes"],
        ["payload", "encode"],
        ["vchannel", "int"],
        ["messages", "iterable"],
        ["max_messages", "str"],
        ["timeout", "-1"],
    )
    for exc, words in zip(caught, expected, strict=True):
        assert_clear(exc, *words)


def test_sync_client_rejects_bad_arguments_before_starting_its_thread() -> None:
    threads = threading.active_count()
    for kwargs in (
        {"metastore_url": 5},
        {"metastore_url": "sqlite:///unused.db", "cluster": 3},
        {"metastore_url": "sqlite:///unused.db", "producer_options": {"deadline": 1}},
    ):
        with pytest.raises(errors.InvalidArgument):
            SyncClient(**kwargs)
    assert threading.active_count() == threads


async def test_types_and_type_may_be_codes_or_names(
    served: Cluster, client: HeadraceClient
) -> None:
    consumer = client.consume("named", types=["delete", int(MessageType.INSERT)])
    assert consumer.types == {MessageType.DELETE, MessageType.INSERT}
    async with client.producer() as producer:
        await producer.send("named", b"x", type="DELETE")  # type: ignore[arg-type]
    entry = await consumer.next(HANG_GUARD)
    assert entry is not None and entry.message.type is MessageType.DELETE
    await consumer.close()
