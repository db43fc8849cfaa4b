"""The blocking facade, used from a plain thread as blocking code would."""

from __future__ import annotations

import asyncio

import pytest

from headrace import errors
from headrace.client.sync import SyncClient
from headrace.message.types import Message, MessageType
from headrace.wal.api import AppendResult
from tests.node.harness import Cluster


async def test_sync_client_produces_and_consumes(served: Cluster) -> None:
    def work() -> tuple[list[AppendResult | errors.HeadraceError], list[bytes], str]:
        with SyncClient(served.url, "test") as client:
            owner = client.wait_ready(client.route("sync"), timeout=10.0)
            one = client.produce("sync", b"one", properties={"k": "v"})
            many = client.produce_many(
                [Message(MessageType.INSERT, "sync", b"two"), Message(MessageType.INSERT, "x y")]
            )
            payloads = [
                e.message.payload for e in client.consume("sync", max_messages=5, idle_timeout=0.5)
            ]
            return [one, *many], payloads, owner.node

    results, payloads, owner = await asyncio.to_thread(work)
    assert isinstance(results[0], AppendResult) and isinstance(results[1], AppendResult)
    assert isinstance(results[2], errors.InvalidArgument)
    assert payloads == [b"one", b"two"]
    assert owner == "node-a"


async def test_sync_client_reports_an_unreachable_metastore() -> None:
    def connect(url: str) -> None:
        SyncClient(url)

    with pytest.raises(errors.Unavailable):
        await asyncio.to_thread(connect, "etcd://127.0.0.1:1")
    # A client only opens: a missing SQLite file is NotFound (nothing is created).
    with pytest.raises(errors.NotFound):
        await asyncio.to_thread(connect, "sqlite:///proc/no/such/dir/meta.db")
