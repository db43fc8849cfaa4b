"""The coordinator's async loop: elect, then reconcile level-based.

:class:`Coordinator` campaigns (:mod:`~headrace.coordinator.election`); while
leader it makes sure the :class:`~headrace.cluster.ClusterConfig` exists (and
refuses to start if the configured pchannel list differs from the stored one),
then runs reconcile passes: read a :class:`~.snapshot.ClusterSnapshot`, decide
with the pure :func:`~.reconcile.reconcile`, write each decision with
compare-and-swap under the leadership guard. A pass runs after any change under
the nodes, pchannels or requests prefixes (watched), and at least every
``relist_interval_s`` in case a watch dropped; the balancer also runs when the
set of nodes changes and every ``balance_interval_s``. Requests (moves,
freeze, drain, suspend) are keys written by :class:`~.control.ClusterAdmin`.
When deposed, writes fail with :class:`~.election.NotLeader`; the loop steps
down and campaigns again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Sequence

from headrace import errors
from headrace.cluster import (
    NEW_CLUSTER_ROUTING,
    AssignmentState,
    ClusterConfig,
    ClusterFormat,
    Keys,
)
from headrace.coordinator import state
from headrace.coordinator.control import ControlKeys, parse_record
from headrace.coordinator.election import Election, Leadership, NotLeader
from headrace.coordinator.reconcile import Plan, Policy, View, reconcile
from headrace.coordinator.snapshot import ClusterSnapshot, read_snapshot
from headrace.guarded import TaskFailure, cancel_and_settle, guarded_task, wait_any
from headrace.message.formats import DEFAULT_FORMAT, RELEASE_FORMATS, write_refusal
from headrace.metastore.contract import Compare, Delete, Metastore, Op, Put

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CoordinatorConfig:
    pchannels: Sequence[str] | None = None
    """The cluster's pchannels; None uses the stored list (error if none is)."""
    wal_backend: str | None = None
    """WAL backend of a new cluster (default "local"); None accepts the stored one."""
    coordinator_id: str = ""
    """Defaults to a random id."""
    lease_ttl_s: float = 3.0
    """TTL of the election lease."""
    transition_timeout_s: float = 10.0
    """A node that neither opens (ASSIGNING) nor releases (UNASSIGNING) within
    this time is bypassed: the pchannel goes to another node with term + 1."""
    balance_interval_s: float = 5.0
    relist_interval_s: float = 2.0
    max_moves_per_round: int = 2
    retry_backoff_s: float = 0.5
    message_format: int = DEFAULT_FORMAT
    """Message format a new cluster starts in (one this coordinator creates; an
    existing cluster keeps its own, switched by ``headrace format set``). As
    Kafka's ``log.message.format.version``: a cluster whose nodes may run an
    older release starts in the format they all write."""

    def validate(self) -> None:
        if self.pchannels is not None:
            names = list(self.pchannels)
            if not names:
                raise errors.InvalidArgument("the pchannel list is empty")
            bad = [name for name in names if not name or "/" in name]
            if bad:
                raise errors.InvalidArgument(f"invalid pchannel names {bad!r}")
            if len(set(names)) != len(names):
                raise errors.InvalidArgument(f"duplicate pchannel names in {names!r}")
        timings = {
            "lease_ttl_s": self.lease_ttl_s,
            "transition_timeout_s": self.transition_timeout_s,
            "balance_interval_s": self.balance_interval_s,
            "relist_interval_s": self.relist_interval_s,
        }
        for name, value in timings.items():
            if value <= 0:
                raise errors.InvalidArgument(f"{name} must be positive, got {value}")
        if self.max_moves_per_round < 1:
            raise errors.InvalidArgument("max_moves_per_round must be at least 1")
        refusal = write_refusal(RELEASE_FORMATS, self.message_format)
        if refusal:
            raise errors.InvalidArgument(f"a new cluster's message format: {refusal}")


@dataclasses.dataclass
class _Observed:
    """What the coordinator remembers between passes (not authoritative)."""

    since: dict[str, tuple[tuple[object, ...], float]] = dataclasses.field(default_factory=dict)
    hints: dict[str, tuple[int, str]] = dataclasses.field(default_factory=dict)
    nodes: frozenset[str] | None = None
    next_balance: float = 0.0
    pinned: dict[str, str] = dataclasses.field(default_factory=dict)
    """pchannel -> node an operator request moved it to (until it goes elsewhere)."""
    leases: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    """node -> (lease of its session key, revision its session began at)."""

    def session_revisions(self, snapshot: ClusterSnapshot) -> dict[str, int]:
        """When each node's current session began. A new lease on a key that
        still exists (a quick restart) begins at the key's mod revision."""
        began: dict[str, int] = {}
        for node, session in snapshot.sessions.items():
            known = self.leases.get(node)
            if known is None:
                revision = session.create_revision
            elif known[0] != session.lease:
                revision = session.mod_revision
            else:
                revision = known[1]
            self.leases[node] = (session.lease, revision)
            began[node] = revision
        for node in set(self.leases) - set(snapshot.sessions):
            del self.leases[node]
        return began

    def ages(self, snapshot: ClusterSnapshot, now: float) -> dict[str, float]:
        ages: dict[str, float] = {}
        for name, record in snapshot.assignments.items():
            signature = (record.state, record.term, record.node, record.target)
            seen = self.since.get(name)
            if seen is None or seen[0] != signature:
                seen = (signature, now)
                self.since[name] = seen
            ages[name] = now - seen[1]
            if record.state is AssignmentState.UNASSIGNING and record.target:
                self.hints[name] = (record.term, record.target)
        for name in set(self.since) - set(snapshot.assignments):
            del self.since[name]
        return ages

    def hint_map(self, snapshot: ClusterSnapshot) -> dict[str, str]:
        hints: dict[str, str] = {}
        for name, (term, target) in self.hints.items():
            record = snapshot.assignments.get(name)
            if record is not None and record.term == term:
                hints[name] = target
        return hints


class Coordinator:
    """Assigns, fails over and balances the pchannels of one cluster."""

    def __init__(self, metastore: Metastore, cluster: str, config: CoordinatorConfig) -> None:
        config.validate()
        self.metastore = metastore
        self.config = config
        self.keys = Keys(cluster)
        self.control = ControlKeys(self.keys)
        self.coordinator_id = config.coordinator_id or f"coordinator-{uuid.uuid4().hex[:12]}"
        self.election = Election(metastore, self.keys, self.coordinator_id, ttl=config.lease_ttl_s)
        self.policy = Policy(
            assign_timeout=config.transition_timeout_s,
            unassign_timeout=config.transition_timeout_s,
            max_moves_per_round=config.max_moves_per_round,
        )
        self.leadership: Leadership | None = None
        self.passes = 0
        self._pchannels: tuple[str, ...] = ()
        self._observed = _Observed()

    @property
    def is_leader(self) -> bool:
        return self.leadership is not None and not self.leadership.lost.is_set()

    async def run(self, stop: asyncio.Event) -> None:
        """Campaign and lead until ``stop`` is set.

        Raises InvalidArgument when the configured pchannel list conflicts with
        the stored one (nothing is changed then).
        """
        while not stop.is_set():
            leadership = await self.election.campaign(stop)
            if leadership is None:
                return
            self.leadership = leadership
            self._observed = _Observed()
            try:
                await self._lead(leadership, stop)
            except NotLeader as exc:
                log.warning("coordinator %s steps down: %s", self.coordinator_id, exc)
            finally:
                self.leadership = None
                await self.election.resign(leadership)

    async def _lead(self, leadership: Leadership, stop: asyncio.Event) -> None:
        await self._ensure_config(leadership, stop)
        dirty = asyncio.Event()
        dirty.set()
        prefixes = (self.keys.nodes, self.keys.pchannels, self.control.requests, self.keys.format)
        failures: list[TaskFailure] = []
        broken = asyncio.Event()

        async def on_failure(failure: TaskFailure) -> None:
            failures.append(failure)
            broken.set()

        watchers = [
            guarded_task(
                self._watch(prefix, dirty, leadership), f"watch {prefix}", on_failure, logger=log
            )
            for prefix in prefixes
        ]
        try:
            while not stop.is_set() and not leadership.lost.is_set():
                if failures:
                    # Without its watch the coordinator would act on stale views: it steps
                    # down, and ``run`` raises.
                    raise errors.HeadraceError(
                        f"coordinator {self.coordinator_id} stops leading: {failures[0].describe()}"
                    )
                await wait_any(
                    (dirty, stop, leadership.lost, broken), self.config.relist_interval_s
                )
                if stop.is_set() or leadership.lost.is_set() or broken.is_set():
                    continue
                dirty.clear()
                try:
                    await self._pass(leadership)
                except errors.Unavailable as exc:
                    log.warning("reconcile pass failed, retrying: %s", exc)
                    await wait_any((stop, leadership.lost), self.config.retry_backoff_s)
            if leadership.lost.is_set():
                raise NotLeader(f"coordinator {self.coordinator_id} lost its election lease")
        finally:
            await cancel_and_settle(
                watchers,
                what=f"coordinator {self.coordinator_id}: stopping its watches",
                logger=log,
            )

    async def _ensure_config(self, leadership: Leadership, stop: asyncio.Event) -> None:
        while not stop.is_set() and not leadership.lost.is_set():
            try:
                if await self._try_ensure_config(leadership):
                    return
            except errors.Unavailable as exc:
                log.warning("cannot read the cluster config yet: %s", exc)
            await wait_any((stop, leadership.lost), self.config.retry_backoff_s)

    async def _try_ensure_config(self, leadership: Leadership) -> bool:
        kv = await self.metastore.get(self.keys.config)
        wanted = self.config.pchannels
        if kv is None:
            if wanted is None:
                raise errors.InvalidArgument(
                    f"no pchannel list configured and none stored at {self.keys.config}"
                )
            config = ClusterConfig(
                pchannels=list(wanted),
                wal_backend=self.config.wal_backend or "local",
                routing=NEW_CLUSTER_ROUTING,
            )
            guards = [Compare.absent(self.keys.config)]
            puts = [Put(self.keys.config, config.to_json())]
            wanted_format = self.config.message_format
            if (
                wanted_format != DEFAULT_FORMAT
                and await self.metastore.get(self.keys.format) is None
            ):
                guards.append(Compare.absent(self.keys.format))
                record = ClusterFormat(
                    version=wanted_format,
                    previous=DEFAULT_FORMAT,
                    changed_at=time.time(),
                    reason="the cluster's message format at creation",
                )
                puts.append(Put(self.keys.format, record.to_json()))
            result = await leadership.guarded_txn(guards, puts)
            if not result.succeeded:
                return False
            log.info(
                "created cluster config with %d pchannels, message format %d",
                len(config.pchannels),
                self.config.message_format,
            )
        else:
            config = parse_record(ClusterConfig, kv.value)
            if wanted is not None and list(wanted) != config.pchannels:
                raise errors.InvalidArgument(
                    f"configured pchannels {list(wanted)} differ from the stored list "
                    f"{config.pchannels}; the pchannel list of a cluster never changes silently"
                )
            backend = self.config.wal_backend
            if backend is not None and config.wal_backend != backend:
                raise errors.InvalidArgument(
                    f"configured WAL backend {backend!r} differs from the "
                    f"stored {config.wal_backend!r}"
                )
        self._pchannels = tuple(config.pchannels)
        return True

    async def _watch(self, prefix: str, dirty: asyncio.Event, leadership: Leadership) -> None:
        """Set ``dirty`` on every change; re-open a dropped watch (the relist
        timer covers the gap)."""
        while not leadership.lost.is_set():
            try:
                watch = await self.metastore.watch_prefix(prefix)
                try:
                    async for _event in watch:
                        dirty.set()
                finally:
                    with contextlib.suppress(errors.HeadraceError):
                        await watch.close()
            except errors.HeadraceError as exc:
                log.info("watch on %s dropped: %s", prefix, exc)
            dirty.set()
            await asyncio.sleep(self.config.relist_interval_s)

    async def _pass(self, leadership: Leadership) -> Plan:
        snapshot = await read_snapshot(self.metastore, self.keys)
        if snapshot.corrupt:
            log.error("malformed records left untouched: %s", ", ".join(snapshot.corrupt))
        loop_now = asyncio.get_running_loop().time()
        observed = self._observed
        ages = observed.ages(snapshot, loop_now)
        node_set = frozenset(snapshot.nodes)
        rebalance = node_set != observed.nodes or loop_now >= observed.next_balance
        if rebalance:
            observed.nodes = node_set
            observed.next_balance = loop_now + self.config.balance_interval_s
        corrupt = set(snapshot.corrupt)
        view = View(
            pchannels=self._decidable(corrupt),
            assignments=snapshot.assignments,
            nodes=snapshot.live_nodes(observed.session_revisions(snapshot)),
            ages=ages,
            move_requests={name: request.to for name, request in snapshot.moves.items()},
            hints=observed.hint_map(snapshot),
            record_revisions={
                name: snapshot.revisions.get(self.keys.pchannel(name), 0)
                for name in snapshot.assignments
            },
            lagging=frozenset(name for name, s in snapshot.statuses.items() if s.lagging),
            pinned=frozenset(observed.pinned),
            collections={name: frozenset(s.collections) for name, s in snapshot.statuses.items()},
            suspended=snapshot.balance.suspended,
            cluster_format=snapshot.cluster_format.version,
            log_formats={name: frozenset(f.written) for name, f in snapshot.log_formats.items()},
        )
        plan = reconcile(view, time.time(), self.policy, rebalance=rebalance)
        await self._apply(plan, snapshot, leadership)
        self.passes += 1
        return plan

    def _decidable(self, corrupt: set[str]) -> tuple[str, ...]:
        """pchannels whose records parse: none while the cluster's format
        record is malformed (nobody knows which nodes may write), else those
        whose assignment and log formats records are not malformed."""
        if self.keys.format in corrupt:
            return ()
        keys = self.keys
        return tuple(
            p
            for p in self._pchannels
            if keys.pchannel(p) not in corrupt and keys.log_format(p) not in corrupt
        )

    async def _apply(self, plan: Plan, snapshot: ClusterSnapshot, leadership: Leadership) -> None:
        for decision in plan.decisions:
            name = decision.pchannel
            previous = snapshot.assignments.get(name)
            problem = state.transition_error(previous, decision.record)
            if problem:
                log.error("refusing an invalid transition (a bug): %s", problem)
                continue
            key = self.keys.pchannel(name)
            compares = [Compare.mod_revision_is(key, snapshot.revisions.get(key, 0))]
            ops: list[Op] = [Put(key, decision.record.to_json())]
            if decision.request_done and name in snapshot.moves:
                compares.append(self._request_unchanged(name, snapshot))
                ops.append(Delete(self.control.move(name)))
            result = await leadership.guarded_txn(compares, ops)
            record = decision.record
            if result.succeeded:
                pins = self._observed.pinned
                if decision.request_done:
                    pins[name] = state.destination(record)
                elif pins.get(name) != state.destination(record):
                    pins.pop(name, None)
                log.info(
                    "%s -> %s term=%d node=%s target=%s (%s)",
                    name,
                    record.state.value,
                    record.term,
                    record.node or "-",
                    record.target or "-",
                    decision.reason,
                )
            else:
                log.debug("%s changed meanwhile; decided again next pass", name)
        for name in plan.dropped_requests:
            await leadership.guarded_txn(
                [self._request_unchanged(name, snapshot)], [Delete(self.control.move(name))]
            )
            log.info("move request of %s dropped (done, or the target is not eligible)", name)

    def _request_unchanged(self, pchannel: str, snapshot: ClusterSnapshot) -> Compare:
        key = self.control.move(pchannel)
        return Compare.mod_revision_is(key, snapshot.revisions.get(key, 0))
