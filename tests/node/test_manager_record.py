"""The Manager service acts only on what the pchannel's assignment record says.

OpenWAL at a term the coordinator never gave out used to fence the backend
there (term 99 wedged the pchannel: the next owner's open at term 6 was
refused until the coordinator's terms caught up), and CloseWAL with term 0
left a pchannel ASSIGNED to a node that no longer served it, for good. Each
call now reads the record from the metastore and is refused, with what the
record says, unless the record names this node at that term.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from headrace import errors
from headrace.client.manager import ManagerClient
from headrace.cluster import Assignment, AssignmentState
from headrace.node.assignments import refuse_close, refuse_open
from tests.node.harness import Cluster, record

P = "pchannel-000"
A = AssignmentState


@pytest.mark.parametrize(
    ("rec", "term", "refusal"),
    [
        (None, 1, errors.NotOwner),
        (record(A.ASSIGNED, "me", 5), 5, None),
        (record(A.ASSIGNING, "me", 5), 5, None),
        (record(A.ASSIGNED, "me", 5), 99, errors.InvalidArgument),
        (record(A.ASSIGNED, "me", 5), 4, errors.Fenced),
        (record(A.ASSIGNED, "other", 5), 5, errors.NotOwner),
        (record(A.ASSIGNING, "other", 6), 99, errors.NotOwner),
        (record(A.UNASSIGNING, "me", 5), 5, errors.NotOwner),
        (record(A.UNASSIGNED, "me", 5), 5, errors.NotOwner),
    ],
)
def test_refuse_open(
    rec: Assignment | None, term: int, refusal: type[errors.HeadraceError] | None
) -> None:
    verdict = refuse_open(P, term, rec, "me")
    if refusal is None:
        assert verdict is None
    else:
        assert type(verdict) is refusal
        assert "record" in verdict.message


@pytest.mark.parametrize(
    ("rec", "term", "held", "refusal"),
    [
        (record(A.ASSIGNED, "me", 5), 0, 5, errors.InvalidArgument),
        (record(A.ASSIGNED, "me", 5), 5, 5, errors.InvalidArgument),
        (record(A.ASSIGNING, "me", 5), 5, None, errors.InvalidArgument),
        (record(A.ASSIGNED, "me", 5), 4, 5, errors.Fenced),
        (record(A.ASSIGNED, "me", 5), 6, 5, errors.InvalidArgument),
        (record(A.UNASSIGNING, "me", 5), 5, 5, None),
        (record(A.ASSIGNED, "other", 6), 5, 5, None),
        (record(A.ASSIGNED, "other", 6), 4, 5, errors.Fenced),
        (record(A.ASSIGNED, "other", 6), 6, 5, errors.InvalidArgument),
        (None, 3, None, None),
        (None, 0, None, errors.InvalidArgument),
    ],
)
def test_refuse_close(
    rec: Assignment | None,
    term: int,
    held: int | None,
    refusal: type[errors.HeadraceError] | None,
) -> None:
    verdict = refuse_close(P, term, rec, "me", held)
    if refusal is None:
        assert verdict is None
    else:
        assert type(verdict) is refusal


@contextlib.asynccontextmanager
async def manager_of(address: str) -> AsyncIterator[ManagerClient]:
    """A Manager client of the node at ``address``, closed on exit."""
    manager = ManagerClient(address)
    try:
        yield manager
    finally:
        await manager.close()


async def served_at(manager: ManagerClient, term: int) -> None:
    status = (await manager.list_wals()).find(P)
    assert status is not None and (status.term, status.state) == (term, "SERVING"), status


async def test_open_ahead_of_the_record_is_refused_and_wedges_nothing(cluster: Cluster) -> None:
    await cluster.start_node("node-a")
    node_b = await cluster.start_node("node-b")
    owner = cluster.nodes["node-a"]
    await cluster.assign(P, "node-a", 5)
    async with manager_of(owner.address) as manager:
        with pytest.raises(errors.InvalidArgument) as info:
            await manager.open_wal(P, 99)
        assert "term 99" in info.value.message
        assert "ASSIGNED to node node-a at term 5" in info.value.message
        await served_at(manager, 5)
    # The next owner takes it at the coordinator's next term, not after 99.
    moved = await cluster.move(P, "node-b")
    assert (moved.node, moved.term, moved.state) == ("node-b", 6, A.ASSIGNED)
    assert node_b.manager is not None and node_b.manager.get(P).term == 6


async def test_close_under_the_record_is_refused_and_the_wal_stays_served(
    cluster: Cluster,
) -> None:
    node = await cluster.start_node("node-a")
    await cluster.assign(P, "node-a", 5)
    async with manager_of(node.address) as manager:
        with pytest.raises(errors.InvalidArgument) as zero:
            await manager.close_wal(P, 0)
        assert "ASSIGNED to node node-a at term 5" in zero.value.message
        with pytest.raises(errors.InvalidArgument) as current:
            await manager.close_wal(P, 5)  # the record says this node serves it
        assert "through the coordinator" in current.value.message
        with pytest.raises(errors.Fenced) as older:
            await manager.close_wal(P, 4)
        assert (older.value.term, older.value.current_term) == (4, 5)
        await served_at(manager, 5)
    still = await cluster.record(P)
    assert still is not None and (still.state, still.node, still.term) == (A.ASSIGNED, "node-a", 5)
    # The way out is through the record: a graceful unassign releases it.
    released = await cluster.unassign(P)
    assert released.state is A.UNASSIGNED
    assert node.manager is not None and P not in node.manager.held


async def test_open_of_a_pchannel_recorded_for_another_node_is_refused(cluster: Cluster) -> None:
    node_a = await cluster.start_node("node-a")
    node_b = await cluster.start_node("node-b")
    await cluster.assign(P, "node-b", 3)
    async with manager_of(node_a.address) as manager:
        for term in (3, 4, 99):
            with pytest.raises(errors.NotOwner) as info:
                await manager.open_wal(P, term)
            assert info.value.owner == "node-b" and info.value.term == 3
            assert "ASSIGNED to node node-b at term 3" in info.value.message
        assert (await manager.list_wals()).find(P) is None
    assert node_b.manager is not None and node_b.manager.get(P).term == 3


async def test_open_below_or_away_from_the_record_is_refused(cluster: Cluster) -> None:
    node = await cluster.start_node("node-a")
    await cluster.assign(P, "node-a", 5)
    await cluster.unassign(P)  # UNASSIGNED at term 5, still naming node-a
    async with manager_of(node.address) as manager:
        with pytest.raises(errors.NotOwner) as released:
            await manager.open_wal(P, 5)
        assert "UNASSIGNED" in released.value.message
        await cluster.write(
            Assignment(
                pchannel=P,
                state=A.ASSIGNING,
                term=7,
                node="node-a",
                updated_at=time.time(),
            )
        )
        await cluster.wait_state(P, A.ASSIGNED, 7)
        with pytest.raises(errors.Fenced) as below:
            await manager.open_wal(P, 6)
        assert (below.value.term, below.value.current_term) == (6, 7)
        # At the record's own term it is the idempotent open of what is served.
        opened = await manager.open_wal(P, 7)
        assert (opened.term, opened.state) == (7, "SERVING")
