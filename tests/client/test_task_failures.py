"""A client task that fails on an unexpected error fails what depends on it at once.

Each test injects a defect (an internal method raising RuntimeError) into one
of the client's long-running tasks: the owner watch of a Produce stream, the
successor watch of a Consume stream, the follower of the cluster view. The
senders and the consumer get an error naming the cause promptly, instead of
waiting for their deadline or never hearing of it.
"""

from __future__ import annotations

import asyncio

import pytest

from headrace import errors
from headrace.client import HeadraceClient, ProducerOptions
from headrace.client.discovery import ClusterView, Owner
from headrace.metastore.contract import WatchEvent
from tests.client.conftest import PCHANNELS
from tests.node.harness import Cluster

PROMPTLY = 20.0
"""Seconds within which the failure must reach the caller (the deadline is longer)."""

LONG_DEADLINE = ProducerOptions(deadline=120.0)


async def _broken_successor_wait(self: ClusterView, owner: Owner) -> Owner:
    raise RuntimeError("injected successor-wait defect")


def _broken_event(self: ClusterView, event: WatchEvent) -> None:
    raise RuntimeError("injected follower defect")


async def test_a_failed_owner_watch_fails_the_pending_send(
    served: Cluster, client: HeadraceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ClusterView, "wait_successor", _broken_successor_wait)
    async with client.producer(LONG_DEADLINE) as producer:
        async with asyncio.timeout(PROMPTLY):
            with pytest.raises(errors.HeadraceError, match="injected successor-wait defect"):
                await producer.send("a", b"x")
            # The lane restarts for the next message, and fails it the same way.
            with pytest.raises(errors.HeadraceError, match="injected successor-wait defect"):
                await producer.send("b", b"y")


async def test_a_failed_successor_watch_fails_the_consumer(
    served: Cluster, client: HeadraceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with client.producer() as producer:
        await producer.send("a", b"x")
    monkeypatch.setattr(ClusterView, "wait_successor", _broken_successor_wait)
    async with client.consume("a") as consumer:
        async with asyncio.timeout(PROMPTLY):
            with pytest.raises(errors.HeadraceError, match="injected successor-wait defect"):
                for _ in range(3):
                    await consumer.next(timeout=2.0)


async def test_a_failed_view_follower_fails_sends_and_consumers(
    cluster: Cluster, client: HeadraceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await cluster.configure(PCHANNELS)
    await cluster.start_node("node-a")
    monkeypatch.setattr(ClusterView, "_on_event", _broken_event)
    # The record of the new owner is the event the follower dies on.
    for pchannel in PCHANNELS:
        await cluster.assign(pchannel, "node-a", 1)
    async with client.producer(LONG_DEADLINE) as producer:
        async with asyncio.timeout(PROMPTLY):
            with pytest.raises(errors.HeadraceError, match="injected follower defect"):
                await producer.send("a", b"x")
    async with client.consume("a") as consumer:
        async with asyncio.timeout(PROMPTLY):
            with pytest.raises(errors.HeadraceError, match="injected follower defect"):
                await consumer.next(timeout=2.0)
