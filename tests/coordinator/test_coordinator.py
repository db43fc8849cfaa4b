"""The coordinator loop against the real SQLite metastore.

Nodes are simulated by :class:`SimNode`: a session key under a lease kept
alive in the background, and a task that follows the assignment protocol by
compare-and-swap on its records. ``crash()`` stops both without revoking, so
the session key disappears when the lease TTL runs out. A :class:`TermMonitor`
watches every record change and checks that terms never decrease.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable

import pytest

from headrace import errors
from headrace.cluster import (
    NEW_CLUSTER_ROUTING,
    Assignment,
    AssignmentState,
    ClusterConfig,
    Keys,
    LogFormats,
    NodeInfo,
)
from headrace.coordinator import state
from headrace.coordinator.control import ClusterAdmin, ControlKeys
from headrace.coordinator.coordinator import Coordinator, CoordinatorConfig
from headrace.coordinator.snapshot import ClusterSnapshot, wait_for
from headrace.coordinator.status import layout_summary
from headrace.message.formats import RELEASE_FORMATS, FormatSupport
from headrace.metastore.contract import Compare, EventType, Metastore, Put, Watch
from headrace.metastore.sqlite import SqliteMetastore

pytestmark = pytest.mark.timeout(60)

CLUSTER = "test"
KEYS = Keys(CLUSTER)
PCHANNELS = [f"pch-{i:02d}" for i in range(16)]
NODE_TTL = 1.0
S = AssignmentState


def fast_config(**overrides: object) -> CoordinatorConfig:
    values: dict[str, object] = {
        "pchannels": PCHANNELS,
        "lease_ttl_s": 1.0,
        "transition_timeout_s": 2.0,
        "balance_interval_s": 0.3,
        "relist_interval_s": 0.2,
        "max_moves_per_round": 2,
        "retry_backoff_s": 0.1,
    }
    values.update(overrides)
    return CoordinatorConfig(**values)  # type: ignore[arg-type]


class SimNode:
    def __init__(
        self,
        store: Metastore,
        keys: Keys,
        node_id: str,
        *,
        ttl: float = 1.0,
        acks: bool = True,
        formats: FormatSupport = RELEASE_FORMATS,
    ) -> None:
        self.formats = formats
        self.store = store
        self.keys = keys
        self.node_id = node_id
        self.ttl = ttl
        self.acks = acks
        self.lease = 0
        self.acked: list[Assignment] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> SimNode:
        self.lease = await self.store.grant_lease(self.ttl)
        info = NodeInfo(
            node_id=self.node_id,
            address=f"127.0.0.1:{9000 + len(self.node_id)}",
            reads=tuple(sorted(self.formats.reads)),
            writes=tuple(sorted(self.formats.writes)),
        )
        await self.store.put(self.keys.node(self.node_id), info.to_json(), lease=self.lease)
        self._tasks = [
            asyncio.create_task(self._keep_alive(), name=f"{self.node_id}-keepalive"),
            asyncio.create_task(self._follow(), name=f"{self.node_id}-follow"),
        ]
        return self

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 4)
            with contextlib.suppress(errors.Unavailable):
                await self.store.keep_alive(self.lease)

    async def _follow(self) -> None:
        while True:
            if self.acks:
                for kv in await self.store.get_prefix(self.keys.pchannels):
                    record = Assignment.model_validate_json(kv.value)
                    if record.node != self.node_id or record.state not in (
                        AssignmentState.ASSIGNING,
                        AssignmentState.UNASSIGNING,
                    ):
                        continue
                    done = state.acknowledge(record, time.time())
                    result = await self.store.txn(
                        [Compare.mod_revision_is(kv.key, kv.mod_revision)],
                        [Put(kv.key, done.to_json())],
                    )
                    if result.succeeded:
                        self.acked.append(done)
            await asyncio.sleep(0.02)

    async def _halt(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def crash(self) -> None:
        """Stop without revoking: the session key disappears after the TTL."""
        await self._halt()

    async def stop(self) -> None:
        await self._halt()
        await self.store.revoke_lease(self.lease)


class TermMonitor:
    """Watches every change of every assignment record; checks that terms of a
    pchannel never decrease, in revision order."""

    def __init__(self, store: Metastore, keys: Keys) -> None:
        self.store = store
        self.keys = keys
        self.history: dict[str, list[Assignment]] = {}
        self.violations: list[str] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> TermMonitor:
        watch = await self.store.watch_prefix(self.keys.pchannels, start_revision=1)
        self._task = asyncio.create_task(self._run(watch))
        return self

    async def _run(self, watch: Watch) -> None:
        try:
            async for event in watch:
                if event.type is not EventType.PUT:
                    continue
                record = Assignment.model_validate_json(event.kv.value)
                seen = self.history.setdefault(record.pchannel, [])
                if seen and record.term < seen[-1].term:
                    self.violations.append(f"{record.pchannel}: {seen[-1].term} -> {record.term}")
                seen.append(record)
        finally:
            await watch.close()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


@contextlib.asynccontextmanager
async def running(*coordinators: Coordinator) -> AsyncIterator[asyncio.Event]:
    """Run coordinators' ``run(stop)`` for the duration of the block."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(c.run(stop)) for c in coordinators]
    try:
        yield stop
    finally:
        stop.set()
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        for outcome in done:
            if isinstance(outcome, BaseException) and not isinstance(
                outcome, asyncio.CancelledError
            ):
                raise outcome


@pytest.fixture
async def store(tmp_path: object) -> AsyncIterator[Metastore]:
    metastore = await SqliteMetastore.open(f"{tmp_path}/meta.db", reap_interval=0.05)
    yield metastore
    await metastore.close()


@pytest.fixture
async def monitor(store: Metastore) -> AsyncIterator[TermMonitor]:
    watcher = await TermMonitor(store, KEYS).start()
    yield watcher
    await asyncio.sleep(0.1)
    await watcher.stop()
    assert watcher.violations == [], "terms went backwards"


@contextlib.asynccontextmanager
async def sim_nodes(
    store: Metastore, *names: str, ttl: float = NODE_TTL, acks: bool = True
) -> AsyncIterator[dict[str, SimNode]]:
    nodes = {name: await SimNode(store, KEYS, name, ttl=ttl, acks=acks).start() for name in names}
    try:
        yield nodes
    finally:
        for node in nodes.values():
            await node.crash()


def owners(snapshot: ClusterSnapshot) -> Counter[str]:
    return Counter(r.node for r in snapshot.assignments.values() if r.state is S.ASSIGNED)


def all_assigned(on: set[str] | None = None) -> Callable[[ClusterSnapshot], bool]:
    return all_assigned_of(PCHANNELS, on)


def all_assigned_of(
    names: list[str], on: set[str] | None = None
) -> Callable[[ClusterSnapshot], bool]:
    def check(snapshot: ClusterSnapshot) -> bool:
        records = [snapshot.assignments.get(p) for p in names]
        return all(
            r is not None
            and r.state is S.ASSIGNED
            and r.node in snapshot.nodes
            and (on is None or r.node in on)
            for r in records
        )

    return check


def balanced(snapshot: ClusterSnapshot) -> bool:
    summary = layout_summary(
        snapshot.assignments.values(), snapshot.nodes.values(), snapshot.node_controls
    )
    return summary.ready and summary.balanced


async def test_initial_assignment_is_balanced(store: Metastore, monitor: TermMonitor) -> None:
    async with sim_nodes(store, "node-a", "node-b", "node-c"):
        coordinator = Coordinator(store, CLUSTER, fast_config())
        async with running(coordinator):
            snapshot = await wait_for(store, CLUSTER, all_assigned(), 15)
            assert coordinator.is_leader
    assert sorted(owners(snapshot).values()) == [5, 5, 6]
    assert all(r.term >= 1 for r in snapshot.assignments.values())
    assert snapshot.config == ClusterConfig(pchannels=PCHANNELS, routing=NEW_CLUSTER_ROUTING)
    summary = layout_summary(snapshot.assignments.values(), snapshot.nodes.values())
    assert summary.ready and summary.balanced and summary.not_ready == ()


async def test_session_expiry_fails_over_with_higher_terms(
    store: Metastore, monitor: TermMonitor
) -> None:
    async with (
        sim_nodes(store, "node-a", "node-b", "node-c", ttl=NODE_TTL) as nodes,
        running(Coordinator(store, CLUSTER, fast_config())),
    ):
        before = await wait_for(store, CLUSTER, all_assigned(), 15)
        lost = {p for p, r in before.assignments.items() if r.node == "node-c"}
        assert lost
        await nodes["node-c"].crash()
        # Hang guard only: the lease TTL plus generous slack on a loaded machine.
        after = await wait_for(store, CLUSTER, all_assigned({"node-a", "node-b"}), NODE_TTL + 9)
    assert sorted(owners(after).values()) == [8, 8]
    for name in PCHANNELS:
        if name in lost:
            assert after.assignments[name].term > before.assignments[name].term
            history = monitor.history[name]
            crash_terms = [r for r in history if r.term > before.assignments[name].term]
            assert crash_terms[0].state is S.ASSIGNING, "failover goes straight to ASSIGNING"
        else:
            assert after.assignments[name] == before.assignments[name]


async def test_restarted_node_gets_its_pchannels_reopened_under_new_terms(
    store: Metastore, monitor: TermMonitor
) -> None:
    async with (
        sim_nodes(store, "node-a") as nodes,
        running(Coordinator(store, CLUSTER, fast_config(pchannels=PCHANNELS[:4]))),
    ):
        before = await wait_for(store, CLUSTER, all_assigned_of(PCHANNELS[:4]), 15)
        # The node restarts quickly: a new session before the old one expired.
        await nodes["node-a"].crash()
        nodes["node-a"] = await SimNode(store, KEYS, "node-a").start()

        def reopened(snapshot: ClusterSnapshot) -> bool:
            return all_assigned_of(PCHANNELS[:4])(snapshot) and all(
                snapshot.assignments[p].term > before.assignments[p].term for p in PCHANNELS[:4]
            )

        await wait_for(store, CLUSTER, reopened, 15)
    assert len(nodes["node-a"].acked) >= 4, "the new incarnation opened every pchannel"


async def test_node_join_rebalances_with_bounded_moves(
    store: Metastore, monitor: TermMonitor
) -> None:
    async with (
        sim_nodes(store, "node-a", "node-b") as nodes,
        running(Coordinator(store, CLUSTER, fast_config(max_moves_per_round=2))),
    ):
        before = await wait_for(store, CLUSTER, all_assigned(), 15)
        assert sorted(owners(before).values()) == [8, 8]
        nodes["node-c"] = await SimNode(store, KEYS, "node-c").start()
        in_flight: list[int] = []

        def settled(snapshot: ClusterSnapshot) -> bool:
            moving = [r for r in snapshot.assignments.values() if r.state is not S.ASSIGNED]
            in_flight.append(len(moving))
            return balanced(snapshot) and "node-c" in owners(snapshot)

        after = await wait_for(store, CLUSTER, settled, 20, poll_interval=0.02)
    assert sorted(owners(after).values()) == [5, 5, 6]
    assert max(in_flight) <= 2, f"at most two moves at a time, saw {max(in_flight)}"
    moved = [p for p in PCHANNELS if after.assignments[p].node != before.assignments[p].node]
    assert len(moved) == 5 and all(after.assignments[p].node == "node-c" for p in moved)
    for name in moved:
        states = [r.state for r in monitor.history[name]]
        assert states[-4:] == [S.UNASSIGNING, S.UNASSIGNED, S.ASSIGNING, S.ASSIGNED]


async def test_graceful_move_request(store: Metastore, monitor: TermMonitor) -> None:
    async with (
        sim_nodes(store, "node-a", "node-b", "node-c"),
        running(Coordinator(store, CLUSTER, fast_config())),
    ):
        before = await wait_for(store, CLUSTER, all_assigned(), 15)
        counts = owners(before)
        source = max(counts, key=lambda n: (counts[n], n))
        target = min(counts, key=lambda n: (counts[n], n))
        name = next(p for p in PCHANNELS if before.assignments[p].node == source)
        old = before.assignments[name]
        admin = ClusterAdmin(store, CLUSTER)
        with pytest.raises(errors.InvalidArgument):
            await admin.request_move(name, "node-zz")
        with pytest.raises(errors.InvalidArgument):
            await admin.request_move("pch-99", target)
        await admin.request_move(name, target)

        def moved(snapshot: ClusterSnapshot) -> bool:
            record = snapshot.assignments[name]
            return record.node == target and record.state is S.ASSIGNED and not snapshot.moves

        after = await wait_for(store, CLUSTER, moved, 15)
    new = after.assignments[name]
    assert new.term == old.term + 1
    steps = [(r.state, r.term, r.node) for r in monitor.history[name] if r.term >= old.term]
    assert steps == [
        (S.ASSIGNING, old.term, source),
        (S.ASSIGNED, old.term, source),
        (S.UNASSIGNING, old.term, source),
        (S.UNASSIGNED, old.term, source),
        (S.ASSIGNING, old.term + 1, target),
        (S.ASSIGNED, old.term + 1, target),
    ]
    unassigning = monitor.history[name][-4]
    assert unassigning.target == target


async def test_move_to_the_current_owner_answers_at_once(
    store: Metastore, monitor: TermMonitor
) -> None:
    async with (
        sim_nodes(store, "node-a", "node-b"),
        running(Coordinator(store, CLUSTER, fast_config())),
    ):
        before = await wait_for(store, CLUSTER, all_assigned(), 15)
        name = PCHANNELS[0]
        owner = before.assignments[name].node
        submitted = await ClusterAdmin(store, CLUSTER).request_move(name, owner)
        assert not submitted.requested
        assert submitted.record == before.assignments[name]
        # Nothing was written: no request key, no new term.
        assert await store.get(ControlKeys(KEYS).move(name)) is None
        other = "node-b" if owner == "node-a" else "node-a"
        moving = await ClusterAdmin(store, CLUSTER).request_move(name, other)
        assert moving.requested and moving.record == before.assignments[name]
        assert await store.get(ControlKeys(KEYS).move(name)) is not None


async def test_requested_move_is_kept_and_balance_is_restored_with_others(
    store: Metastore, monitor: TermMonitor
) -> None:
    names = PCHANNELS[:4]
    async with (
        sim_nodes(store, "node-a", "node-b"),
        running(Coordinator(store, CLUSTER, fast_config(pchannels=names))),
    ):
        before = await wait_for(store, CLUSTER, all_assigned_of(names), 15)
        name = next(p for p in names if before.assignments[p].node == "node-a")
        await ClusterAdmin(store, CLUSTER).request_move(name, "node-b")

        def settled(snapshot: ClusterSnapshot) -> bool:
            return (
                all_assigned_of(names)(snapshot)
                and snapshot.assignments[name].node == "node-b"
                and sorted(owners(snapshot).values()) == [2, 2]
            )

        after = await wait_for(store, CLUSTER, settled, 20)
    assert after.assignments[name].term == before.assignments[name].term + 1
    returned = [
        p for p in names if p != name and after.assignments[p].node != before.assignments[p].node
    ]
    assert len(returned) == 1, "the balancer moved another pchannel, not the requested one"


async def test_drain_moves_everything_off_and_frozen_node_gets_nothing(
    store: Metastore, monitor: TermMonitor
) -> None:
    async with (
        sim_nodes(store, "node-a", "node-b", "node-c") as nodes,
        running(Coordinator(store, CLUSTER, fast_config(max_moves_per_round=3))),
    ):
        await wait_for(store, CLUSTER, all_assigned(), 15)
        admin = ClusterAdmin(store, CLUSTER)
        await admin.drain_node("node-c")
        drained = await wait_for(store, CLUSTER, all_assigned({"node-a", "node-b"}), 20)
        assert sorted(owners(drained).values()) == [8, 8]
        summary = layout_summary(
            drained.assignments.values(), drained.nodes.values(), drained.node_controls
        )
        assert [n.node_id for n in summary.nodes if n.frozen] == ["node-c"]
        with pytest.raises(errors.InvalidArgument, match="frozen"):
            await admin.request_move(PCHANNELS[0], "node-c")
        # A crash while node-c is frozen: everything goes to node-b only.
        await nodes["node-a"].crash()
        failed_over = await wait_for(store, CLUSTER, all_assigned({"node-b"}), NODE_TTL + 9)
        assert owners(failed_over) == Counter({"node-b": 16})
        await admin.set_frozen("node-c", False)
        thawed = await wait_for(store, CLUSTER, balanced, 20)
    assert owners(thawed) == Counter({"node-b": 8, "node-c": 8})


async def test_suspended_balance_makes_no_moves(store: Metastore, monitor: TermMonitor) -> None:
    admin = ClusterAdmin(store, CLUSTER)
    async with sim_nodes(store, "node-a") as nodes:
        coordinator = Coordinator(store, CLUSTER, fast_config())
        async with running(coordinator):
            await wait_for(store, CLUSTER, all_assigned(), 15)
            await admin.suspend_balance(True)
            nodes["node-b"] = await SimNode(store, KEYS, "node-b").start()
            await wait_for(store, CLUSTER, lambda s: "node-b" in s.nodes, 5)
            passes = coordinator.passes
            await wait_for(store, CLUSTER, lambda s: coordinator.passes >= passes + 5, 10)
            still = await wait_for(store, CLUSTER, all_assigned({"node-a"}), 1)
            assert owners(still) == Counter({"node-a": 16})
            await admin.suspend_balance(False)
            resumed = await wait_for(store, CLUSTER, balanced, 20)
    assert owners(resumed) == Counter({"node-a": 8, "node-b": 8})


async def test_stuck_assignment_is_retried_elsewhere(
    store: Metastore, monitor: TermMonitor
) -> None:
    async with sim_nodes(store, "node-mute", acks=False):
        coordinator = Coordinator(store, CLUSTER, fast_config(transition_timeout_s=0.5))
        async with running(coordinator):
            stuck = await wait_for(
                store,
                CLUSTER,
                lambda s: (
                    len(s.assignments) == 16
                    and all(r.state is S.ASSIGNING for r in s.assignments.values())
                ),
                15,
            )
            async with sim_nodes(store, "node-ok"):
                done = await wait_for(store, CLUSTER, all_assigned({"node-ok"}), 20)
    for name in PCHANNELS:
        assert done.assignments[name].term > stuck.assignments[name].term


async def test_changed_pchannel_list_is_refused(store: Metastore) -> None:
    async with running(Coordinator(store, CLUSTER, fast_config())):
        await wait_for(store, CLUSTER, lambda s: s.config is not None, 10)
    other = Coordinator(store, CLUSTER, fast_config(pchannels=[*PCHANNELS, "pch-extra"]))
    with pytest.raises(errors.InvalidArgument, match="never changes silently"):
        await asyncio.wait_for(other.run(asyncio.Event()), 10)
    kafka = Coordinator(store, CLUSTER, fast_config(wal_backend="kafka"))
    with pytest.raises(errors.InvalidArgument, match="WAL backend"):
        await asyncio.wait_for(kafka.run(asyncio.Event()), 10)
    kv = await store.get(KEYS.config)
    assert kv is not None
    assert ClusterConfig.model_validate_json(kv.value).pchannels == PCHANNELS
    # Without a list the stored one is used.
    reuse = Coordinator(store, CLUSTER, fast_config(pchannels=None))
    async with running(reuse):
        await wait_for(store, CLUSTER, lambda s: len(s.assignments) == 16, 10)


async def test_two_coordinators_one_leader_and_deposed_writes_fail(
    store: Metastore, monitor: TermMonitor
) -> None:
    first = Coordinator(store, CLUSTER, fast_config(coordinator_id="coord-1"))
    second = Coordinator(store, CLUSTER, fast_config(coordinator_id="coord-2"))
    async with sim_nodes(store, "node-a", "node-b"), running(first, second):
        await wait_for(store, CLUSTER, all_assigned(), 15)
        leaders = [c for c in (first, second) if c.is_leader]
        assert len(leaders) == 1
        leadership = leaders[0].leadership
        assert leadership is not None
        # Depose the leader behind its back: its lease is revoked. Either
        # coordinator may win the next election (the deposed one campaigns too).
        await store.revoke_lease(leadership.lease)

        def new_leader(snapshot: ClusterSnapshot) -> bool:
            return any(
                c.leadership is not None and c.is_leader and c.leadership.lease != leadership.lease
                for c in (first, second)
            )

        await wait_for(store, CLUSTER, new_leader, 10)
        terms = [
            c.leadership.term
            for c in (first, second)
            if c.leadership is not None and c.leadership.lease != leadership.lease
        ]
        assert terms and terms[0] > leadership.term
        probe = KEYS.pchannel(PCHANNELS[0])
        before = await store.get(probe)
        with pytest.raises(errors.Conflict):
            await leadership.guarded_txn([], [Put(probe, b"stale")])
        assert await store.get(probe) == before
        await wait_for(store, CLUSTER, all_assigned(), 15)
        assert not (first.is_leader and second.is_leader)


async def test_a_pchannel_waits_for_a_node_that_can_read_its_log(
    store: Metastore, monitor: TermMonitor
) -> None:
    """The coordinator reads the formats written in each log: a pchannel whose
    log holds a format this release does not read (3) waits UNAVAILABLE
    (saying why) while only this release's nodes run, and goes to the first
    node that reads it."""
    names = PCHANNELS[:3]
    await store.put(KEYS.log_format(names[0]), LogFormats(written=(1, 3)).to_json())
    nodes = {"node-a": await SimNode(store, KEYS, "node-a").start()}
    try:
        async with running(Coordinator(store, CLUSTER, fast_config(pchannels=names))):

            def waiting(s: ClusterSnapshot) -> bool:
                first = s.assignments.get(names[0])
                rest = [s.assignments.get(n) for n in names[1:]]
                return (
                    first is not None
                    and first.state is S.UNAVAILABLE
                    and all(r is not None and r.state is S.ASSIGNED for r in rest)
                )

            snapshot = await wait_for(store, CLUSTER, waiting, 15)
            assert snapshot.assignments[names[0]].reason == (
                "no eligible node: node-a: its log holds message format {3}, which a node "
                f"that {RELEASE_FORMATS} cannot read"
            )
            reader = FormatSupport.of({1, 2, 3}, {1})
            nodes["node-b"] = await SimNode(store, KEYS, "node-b", formats=reader).start()

            def placed(s: ClusterSnapshot) -> bool:
                first = s.assignments.get(names[0])
                return first is not None and first.state is S.ASSIGNED

            snapshot = await wait_for(store, CLUSTER, placed, 15)
            assert snapshot.assignments[names[0]].node == "node-b"
            assert snapshot.assignments[names[0]].reason == ""
    finally:
        for node in nodes.values():
            await node.stop()
