"""How a node reacts to the assignment records in the metastore.

The coordinator writes records; the node follows them (see
:mod:`headrace.cluster`). :func:`decide` is the pure rule; :class:`Reactor`
lists and watches the cluster's keys, keeps the node's :class:`Directory`
current and carries the decisions out, one pchannel at a time, always acting
on the newest record it has seen. A step that fails with a retryable error
(a WAL whose broker is down, a metastore hiccup) is retried with exponential
backoff (:func:`retry_delay`) until it succeeds or a newer record replaces it.
Every task the reactor runs is guarded (:mod:`headrace.guarded`): any other
failure is logged at once and handed to the node's ``on_failure``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from headrace import errors
from headrace.cluster import Assignment, AssignmentState, ClusterConfig, Keys, NodeInfo
from headrace.coordinator.writestop import stop_key
from headrace.guarded import OnFailure, cancel_and_settle, guarded_task
from headrace.metastore.contract import (
    Compare,
    EventType,
    Get,
    KeyValue,
    Metastore,
    Put,
    Watch,
    WatchEvent,
)
from headrace.node.walmanager import WALManager
from headrace.node.writegate import WriteGate

log = logging.getLogger(__name__)

R = TypeVar("R", Assignment, NodeInfo, ClusterConfig)


def parse_record(cls: type[R], data: bytes) -> R:
    """Decode a cluster record; CorruptData if it is malformed."""
    record = cls.from_json(data)
    if not isinstance(record, cls):
        raise errors.CorruptData(f"malformed {cls.__name__} record")
    return record


class Action(enum.Enum):
    NONE = "none"
    OPEN = "open"
    """Open the WAL under the record's term, then CAS ASSIGNING -> ASSIGNED."""
    RELEASE = "release"
    """Drain and close the WAL (if held), then CAS UNASSIGNING -> UNASSIGNED."""
    CLOSE = "close"
    """Close the held WAL at once: somebody else has (or will have) the pchannel."""
    REOPEN = "reopen"
    """Open the WAL again under the record's term: it failed while served (its
    broker went away) or reopening it failed; the record stays ASSIGNED."""


def decide(
    record: Assignment | None, node_id: str, held_term: int | None, *, broken: bool = False
) -> Action:
    """What a node holding ``held_term`` (None: nothing) does about ``record``.

    ``broken``: this process served the pchannel under ``record.term`` and lost
    it to a backend failure (the WAL is UNAVAILABLE, or reopening it failed).
    """
    if record is None:
        return Action.NONE if held_term is None else Action.CLOSE
    mine = record.node == node_id
    if (
        broken
        and mine
        and record.state is AssignmentState.ASSIGNED
        and held_term in (None, record.term)
    ):
        return Action.REOPEN
    if mine and record.state is AssignmentState.ASSIGNING:
        if held_term is not None and held_term > record.term:
            return Action.NONE
        return Action.OPEN
    if mine and record.state is AssignmentState.UNASSIGNING:
        return Action.RELEASE
    if held_term is None:
        return Action.NONE
    if not mine:
        return Action.CLOSE
    if record.state is AssignmentState.ASSIGNED:
        return Action.CLOSE if record.term > held_term else Action.NONE
    # UNASSIGNED or UNAVAILABLE naming this node.
    return Action.CLOSE if record.term >= held_term else Action.NONE


SERVES = (AssignmentState.ASSIGNING, AssignmentState.ASSIGNED)
"""Record states in which the named node must serve the pchannel."""


def says(record: Assignment | None) -> str:
    """What ``record`` says, for error messages (pure)."""
    if record is None:
        return "no assignment record exists"
    node = f"node {record.node}" if record.node else "no node"
    return f"the record says {record.state.value} to {node} at term {record.term}"


def refuse_open(
    pchannel: str, term: int, record: Assignment | None, node_id: str
) -> errors.HeadraceError | None:
    """Why node ``node_id`` must not open ``pchannel`` at ``term`` on request
    (the Manager's OpenWAL), given the pchannel's current record; None: it may.

    A node serves only what its record names it to serve, at the record's
    term: opening at any other term would fence the backend at a term the
    coordinator never gave out (and wedge the pchannel until its terms catch
    up), or serve a pchannel another node owns.
    """
    if record is None or record.node != node_id or record.state not in SERVES:
        owner = record.node if record is not None and record.state in SERVES else ""
        return errors.NotOwner(
            f"node {node_id} may not open {pchannel} at term {term}: {says(record)}",
            owner=owner,
            term=0 if record is None else record.term,
        )
    if term < record.term:
        return errors.Fenced(
            f"cannot open {pchannel} at term {term}: {says(record)}",
            term=term,
            current_term=record.term,
        )
    if term > record.term:
        return errors.InvalidArgument(
            f"cannot open {pchannel} at term {term}: {says(record)}; "
            "only the coordinator gives out terms"
        )
    return None


def refuse_close(
    pchannel: str, term: int, record: Assignment | None, node_id: str, held_term: int | None
) -> errors.HeadraceError | None:
    """Why node ``node_id`` (holding ``held_term``, None: nothing) must not close
    ``pchannel`` at ``term`` on request (the Manager's CloseWAL); None: it may.

    A close names the term it closes. While the record says this node serves
    the pchannel, nothing else would ever reopen it, so a close is refused:
    a pchannel leaves a node through its record (UNASSIGNING, written by the
    coordinator's move or drain), never by closing the WAL under the record.
    """
    if term <= 0:
        return errors.InvalidArgument(
            f"closing {pchannel} needs the term of the WAL to close ({says(record)})"
        )
    if record is not None and record.node == node_id and record.state in SERVES:
        if term < record.term:
            return errors.Fenced(
                f"cannot close {pchannel} at term {term}: {says(record)}",
                term=term,
                current_term=record.term,
            )
        return errors.InvalidArgument(
            f"node {node_id} may not close {pchannel}: {says(record)}, so this node must "
            "serve it; move or drain it through the coordinator, which unassigns it first"
        )
    if held_term is not None and held_term > term:
        return errors.Fenced(
            f"{pchannel} is held at term {held_term}; cannot close term {term}",
            term=term,
            current_term=held_term,
        )
    if held_term is not None and held_term < term:
        return errors.InvalidArgument(
            f"{pchannel} is held at term {held_term}, not {term} ({says(record)})"
        )
    return None


async def read_assignment(metastore: Metastore, keys: Keys, pchannel: str) -> Assignment | None:
    """The current record of ``pchannel`` in the metastore; CorruptData if malformed."""
    kv = await metastore.get(keys.pchannel(pchannel))
    return None if kv is None else parse_record(Assignment, kv.value)


def retry_delay(attempt: int, base: float, cap: float) -> float:
    """Seconds to wait before retry number ``attempt`` (1, 2, ...): ``base``
    doubling each time, at most ``cap`` (pure)."""
    return min(cap, base * 2.0 ** min(max(attempt, 1) - 1, 30))


class Reactor:
    """Follows the cluster's records for one node."""

    def __init__(
        self,
        metastore: Metastore,
        keys: Keys,
        manager: WALManager,
        address: str,
        on_failure: OnFailure,
        *,
        retry_seconds: float = 0.5,
        max_retry_seconds: float = 10.0,
        session_lease: Callable[[], int] = lambda: 0,
        write_gate: WriteGate | None = None,
    ) -> None:
        self.write_gate = write_gate or WriteGate(manager.node_id)
        """Told every change of the cluster's write stop record."""
        self._stop_key = stop_key(keys)
        self.on_failure = on_failure
        """Told when one of the reactor's tasks fails: the node cannot follow its records."""
        self.session_lease = session_lease
        """The lease of the node's current session, stamped on ASSIGNED records."""
        self.metastore = metastore
        self.keys = keys
        self.manager = manager
        self.node_id = manager.node_id
        self.address = address
        self.retry_seconds = retry_seconds
        """Wait before re-listing after a failed watch, and before a first retry."""
        self.max_retry_seconds = max(max_retry_seconds, retry_seconds)
        self._attempts: dict[str, int] = {}
        """Failed attempts in a row per pchannel (reset by a success)."""
        self._records: dict[str, KeyValue] = {}
        """The newest record of each pchannel."""
        self.heal_seconds = max(retry_seconds, 0.1)
        """How often held WALs are checked for a backend failure to recover from."""
        self._pending: dict[str, tuple[KeyValue | None, int]] = {}
        self._generation: dict[str, int] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._retries: set[asyncio.Task[None]] = set()
        self.synced = asyncio.Event()
        """Set once the first listing has been taken in."""
        self._stopping = asyncio.Event()
        self._watch: Watch | None = None

    async def run(self) -> None:
        """List and watch until :meth:`stop` (or cancelled); survive metastore outages.

        Any error other than a Headrace one (a defect) ends it: the node's
        supervision of this task reports it.
        """
        healer = self._guarded(self._heal(), f"{self.node_id}-heal")
        try:
            while not self._stopping.is_set():
                try:
                    revision = await self._relist()
                    self.synced.set()
                    await self._follow(revision + 1)
                except errors.HeadraceError as exc:
                    log.warning("node %s: watching the cluster failed: %s", self.node_id, exc)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.retry_seconds):
                        await self._stopping.wait()
        finally:
            await cancel_and_settle(
                [healer, *self._workers.values(), *self._retries],
                what=f"node {self.node_id}: stopping the assignment reactor",
                logger=log,
            )

    async def _relist(self) -> int:
        keys = self.keys
        result = await self.metastore.txn(
            [],
            [
                Get(keys.pchannels, prefix=True),
                Get(keys.nodes, prefix=True),
                Get(keys.config),
                Get(self._stop_key),
            ],
        )
        pchannel_kvs, node_kvs, config_kvs, stop_kvs = result.gets
        self.write_gate.observe(stop_kvs[0] if stop_kvs else None)
        directory = self.manager.directory
        directory.addresses = {}
        for kv in node_kvs:
            self._on_node(kv.key, kv)
        directory.config = None
        for kv in config_kvs:
            self._on_config(kv)
        seen = set()
        for kv in pchannel_kvs:
            seen.add(kv.key[len(keys.pchannels) :])
            self._on_pchannel(kv.key, kv)
        for pchannel in set(directory.assignments) - seen:
            self._on_pchannel(keys.pchannel(pchannel), None)
        for pchannel in set(self.manager.held) - seen:
            self._submit(pchannel, None)
        return result.revision

    async def stop(self) -> None:
        """End :meth:`run` by closing its watch (not only by cancelling it)."""
        self._stopping.set()
        if self._watch is not None:
            await self._watch.close()

    async def _follow(self, start_revision: int) -> None:
        watch = await self.metastore.watch_prefix(
            self.keys.root + "/", start_revision=start_revision
        )
        self._watch = watch
        try:
            if self._stopping.is_set():
                return
            async for event in watch:
                self._on_event(event)
        finally:
            self._watch = None
            await watch.close()

    def _on_event(self, event: WatchEvent) -> None:
        kv = event.kv if event.type is EventType.PUT else None
        key = event.kv.key
        if key.startswith(self.keys.pchannels):
            self._on_pchannel(key, kv)
        elif key.startswith(self.keys.nodes):
            self._on_node(key, kv)
        elif key == self.keys.config:
            self._on_config(kv)
        elif key == self._stop_key:
            self.write_gate.observe(kv)

    def _on_config(self, kv: KeyValue | None) -> None:
        try:
            config = None if kv is None else parse_record(ClusterConfig, kv.value)
        except errors.CorruptData as exc:
            log.error("ignoring the cluster config: %s", exc)
            return
        self.manager.directory.config = config

    def _on_node(self, key: str, kv: KeyValue | None) -> None:
        node_id = key[len(self.keys.nodes) :]
        addresses = self.manager.directory.addresses
        if kv is None:
            addresses.pop(node_id, None)
            return
        try:
            info = parse_record(NodeInfo, kv.value)
        except errors.CorruptData as exc:
            log.error("ignoring node record %s: %s", key, exc)
            return
        addresses[node_id] = info.address

    def _on_pchannel(self, key: str, kv: KeyValue | None) -> None:
        pchannel = key[len(self.keys.pchannels) :]
        assignments = self.manager.directory.assignments
        if kv is None:
            assignments.pop(pchannel, None)
            self._records.pop(pchannel, None)
        else:
            self._records[pchannel] = kv
            try:
                record = parse_record(Assignment, kv.value)
            except errors.CorruptData as exc:
                log.error("ignoring assignment record %s: %s", key, exc)
                return
            assignments[pchannel] = record
        self._submit(pchannel, kv)

    # -------------------------------------------------------------- reacting

    async def _heal(self) -> None:
        """Reopen held WALs that a backend failure made UNAVAILABLE (a broker
        outage): their records still say this node serves them. A failed
        reopen is retried with backoff like any other step."""
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.heal_seconds):
                    await self._stopping.wait()
            for pchannel in self.manager.failed_held():
                worker = self._workers.get(pchannel)
                kv = self._records.get(pchannel)
                if kv is not None and (worker is None or worker.done()):
                    log.warning(
                        "node %s: the WAL of %s failed while served; reopening it",
                        self.node_id,
                        pchannel,
                    )
                    self._submit(pchannel, kv)

    def _submit(self, pchannel: str, kv: KeyValue | None) -> None:
        generation = self._generation.get(pchannel, 0) + 1
        self._generation[pchannel] = generation
        self._pending[pchannel] = (kv, generation)
        worker = self._workers.get(pchannel)
        if worker is None or worker.done():
            self._workers[pchannel] = self._guarded(
                self._work(pchannel), f"{self.node_id}-react-{pchannel}"
            )

    async def _work(self, pchannel: str) -> None:
        while pchannel in self._pending:
            kv, generation = self._pending.pop(pchannel)
            try:
                await self._react(pchannel, kv)
            except errors.HeadraceError as exc:
                if not exc.retryable:
                    self._attempts.pop(pchannel, None)
                    log.error("node %s: cannot act on %s: %s", self.node_id, pchannel, exc)
                    continue
                attempt = self._attempts.get(pchannel, 0) + 1
                self._attempts[pchannel] = attempt
                delay = retry_delay(attempt, self.retry_seconds, self.max_retry_seconds)
                log.warning(
                    "node %s: acting on %s failed (attempt %d), will retry in %.1f s: %s",
                    self.node_id,
                    pchannel,
                    attempt,
                    delay,
                    exc,
                )
                self._retry_later(pchannel, kv, generation, delay)
            else:
                self._attempts.pop(pchannel, None)

    def _retry_later(
        self, pchannel: str, kv: KeyValue | None, generation: int, delay: float
    ) -> None:
        async def retry() -> None:
            await asyncio.sleep(delay)
            if self._generation.get(pchannel) == generation:
                self._submit(pchannel, kv)

        task = self._guarded(retry(), f"{self.node_id}-retry-{pchannel}")
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    def _guarded(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A task of the reactor's that ends when its work is done (or on stop)."""
        return guarded_task(coro, name, self.on_failure, finishable=True, logger=log)

    async def _react(self, pchannel: str, kv: KeyValue | None) -> None:
        record = None if kv is None else parse_record(Assignment, kv.value)
        broken = record is not None and self.manager.broken(pchannel, record.term)
        action = decide(record, self.node_id, self.manager.held_term(pchannel), broken=broken)
        if action not in (Action.OPEN, Action.REOPEN):
            self.manager.forget_failure(pchannel)
        if action is Action.NONE:
            return
        if action is Action.CLOSE:
            await self.manager.close(pchannel, drain=False)
            return
        assert kv is not None and record is not None
        if action is Action.REOPEN:
            with contextlib.suppress(errors.Fenced):  # a newer term took it: its record follows
                await self.manager.open(pchannel, record.term)
            return
        if action is Action.OPEN:
            try:
                await self.manager.open(pchannel, record.term)
            except errors.Fenced as exc:
                log.error(
                    "node %s: cannot take %s at term %d: %s",
                    self.node_id,
                    pchannel,
                    record.term,
                    exc,
                )
                return
            new_state = AssignmentState.ASSIGNED
        else:
            await self.manager.close(pchannel, drain=True)
            new_state = AssignmentState.UNASSIGNED
        update = record.model_copy(
            update={
                "state": new_state,
                "address": self.address
                if new_state is AssignmentState.ASSIGNED
                else record.address,
                "session": self.session_lease() if new_state is AssignmentState.ASSIGNED else 0,
                "updated_at": time.time(),
            }
        )
        result = await self.metastore.txn(
            [Compare.mod_revision_is(kv.key, kv.mod_revision)], [Put(kv.key, update.to_json())]
        )
        if result.succeeded:
            log.info(
                "node %s: %s is %s at term %d", self.node_id, pchannel, new_state.value, record.term
            )
        else:
            log.info(
                "node %s: %s changed before it could be marked %s",
                self.node_id,
                pchannel,
                new_state.value,
            )
