"""Requests to the coordinator, stored in the metastore.

Any process (the CLI, the operator, a test) submits a request by writing a key;
whichever coordinator is the leader carries it out. Keys, under ``<root>`` =
``/headrace/<cluster>`` (see :mod:`headrace.cluster` for the others)::

    <root>/requests/moves/<pchannel>   MoveRequest: move the pchannel to ``to``.
                                       Deleted by the leader in the same
                                       transaction that starts the move (or
                                       when it is already there / impossible).
    <root>/requests/nodes/<node id>    NodeControl: ``frozen`` (receives no new
                                       pchannels) and ``draining`` (frozen, and
                                       every pchannel moves off). Not bound to
                                       the node's session: survives restarts.
    <root>/requests/balance            BalanceControl: ``suspended`` stops
                                       balancing moves (drains still proceed).
    <root>/status/pchannels/<pchannel> PChannelStatus, written by the owning
                                       node (optional): ``lagging`` pins the
                                       pchannel, ``collections`` lets the
                                       balancer spread collections.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import TypeVar

import pydantic

from headrace import errors
from headrace.cluster import (
    DEFAULT_CLUSTER,
    Assignment,
    AssignmentState,
    ClusterConfig,
    Keys,
    NodeInfo,
)
from headrace.metastore.contract import Metastore


class _Request(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True, extra="ignore")

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()


class MoveRequest(_Request):
    to: str
    requested_at: float = 0.0


class NodeControl(_Request):
    frozen: bool = False
    draining: bool = False


class BalanceControl(_Request):
    suspended: bool = False


class PChannelStatus(_Request):
    lagging: bool = False
    collections: list[str] = pydantic.Field(default_factory=list)


class ControlKeys:
    """Key builders for requests and node-reported status of one cluster."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.requests = f"{keys.root}/requests/"
        self.moves = f"{self.requests}moves/"
        self.node_controls = f"{self.requests}nodes/"
        self.balance = f"{self.requests}balance"
        self.statuses = f"{keys.root}/status/pchannels/"

    def move(self, pchannel: str) -> str:
        return f"{self.moves}{pchannel}"

    def node_control(self, node_id: str) -> str:
        return f"{self.node_controls}{node_id}"

    def status(self, pchannel: str) -> str:
        return f"{self.statuses}{pchannel}"


_M = TypeVar("_M", bound=pydantic.BaseModel)


def parse_record(model: type[_M], data: bytes) -> _M:
    """Parse a stored JSON record; CorruptData if malformed."""
    try:
        return model.model_validate_json(data)
    except pydantic.ValidationError as exc:
        raise errors.CorruptData(f"malformed {model.__name__} record: {exc}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class MoveSubmitted:
    """What :meth:`ClusterAdmin.request_move` did."""

    pchannel: str
    to: str
    record: Assignment | None
    """The pchannel's assignment record when the request was made."""
    requested: bool
    """False: the pchannel is already ASSIGNED on ``to``; nothing was written."""


class MoveProgress(enum.Enum):
    DONE = "done"
    UNDER_WAY = "under way"
    DROPPED = "dropped"


def move_progress(
    record: Assignment | None, pending: bool, to_node: str, term_before: int
) -> MoveProgress:
    """Where a requested move of a pchannel to ``to_node`` stands (pure).

    ``record``: the assignment now; ``pending``: the request key still exists;
    ``term_before``: the record's term when the move was requested. The leader
    deletes the request in the same write that starts the move (UNASSIGNING
    towards the target, then UNASSIGNED with it as a hint, then ASSIGNING on
    it), or when it drops the request (already there, target not eligible):
    so a request that is gone while the pchannel is not heading to the target
    was dropped, and waiting longer cannot help.
    """
    if record is None:
        return MoveProgress.UNDER_WAY if pending else MoveProgress.DROPPED
    arrived = record.node == to_node and record.state is AssignmentState.ASSIGNED
    if arrived and (record.term > term_before or not pending):
        return MoveProgress.DONE
    if pending:
        return MoveProgress.UNDER_WAY
    heading = (record.state is AssignmentState.ASSIGNING and record.node == to_node) or (
        record.state in (AssignmentState.UNASSIGNING, AssignmentState.UNASSIGNED)
        and record.target == to_node
    )
    return MoveProgress.UNDER_WAY if heading else MoveProgress.DROPPED


def _name(kind: str, value: str) -> str:
    if not value or "/" in value:
        raise errors.InvalidArgument(f"invalid {kind} name {errors.quoted(value)}")
    return value


class ClusterAdmin:
    """Submits requests to whichever coordinator leads ``cluster``."""

    def __init__(self, metastore: Metastore, cluster: str = DEFAULT_CLUSTER) -> None:
        self.metastore = metastore
        self.keys = Keys(cluster)
        self.control = ControlKeys(self.keys)

    async def request_move(self, pchannel: str, to_node: str) -> MoveSubmitted:
        """Ask for a graceful move of ``pchannel`` to ``to_node``.

        InvalidArgument if the pchannel is not configured, or the node is not
        alive or is frozen. Replaces an earlier pending request of the pchannel.
        A pchannel already ASSIGNED on ``to_node`` needs no move: nothing is
        written and the result says so (``requested`` False).
        If the move unbalances the cluster, the balancer restores fairness by
        moving other pchannels first (the leader remembers the pin in memory).
        Await the outcome with :func:`move_progress` or
        :func:`headrace.coordinator.snapshot.wait_for`.
        """
        _name("pchannel", pchannel)
        _name("node", to_node)
        config = await self.metastore.get(self.keys.config)
        if config is None or pchannel not in parse_record(ClusterConfig, config.value).pchannels:
            raise errors.InvalidArgument(f"unknown pchannel {pchannel!r}")
        node = await self.metastore.get(self.keys.node(to_node))
        if node is None:
            raise errors.InvalidArgument(f"node {to_node!r} is not alive")
        control = await self._node_control(to_node)
        info = parse_record(NodeInfo, node.value)
        if info.frozen or control.frozen or control.draining:
            raise errors.InvalidArgument(f"node {to_node!r} is frozen")
        kv = await self.metastore.get(self.keys.pchannel(pchannel))
        record = None if kv is None else parse_record(Assignment, kv.value)
        already = record is not None and record.state is AssignmentState.ASSIGNED
        if already and record is not None and record.node == to_node:
            return MoveSubmitted(pchannel, to_node, record, requested=False)
        request = MoveRequest(to=to_node, requested_at=time.time())
        await self.metastore.put(self.control.move(pchannel), request.to_json())
        return MoveSubmitted(pchannel, to_node, record, requested=True)

    async def set_frozen(self, node: str, frozen: bool) -> None:
        """Freeze (receives no new pchannels) or unfreeze; unfreezing also ends
        a drain (``headrace undrain``): the balancer then gives the node its
        share again."""
        _name("node", node)
        await self.metastore.put(
            self.control.node_control(node), NodeControl(frozen=frozen).to_json()
        )

    async def drain_node(self, node: str) -> None:
        """Freeze ``node`` and move every pchannel off it."""
        _name("node", node)
        control = NodeControl(frozen=True, draining=True)
        await self.metastore.put(self.control.node_control(node), control.to_json())

    async def suspend_balance(self, suspended: bool) -> None:
        """Stop (or resume) balancing moves; drains and requested moves go on."""
        await self.metastore.put(
            self.control.balance, BalanceControl(suspended=suspended).to_json()
        )

    async def node_control(self, node: str) -> NodeControl | None:
        """The freeze/drain request of ``node``; None if it never had one."""
        kv = await self.metastore.get(self.control.node_control(_name("node", node)))
        return None if kv is None else parse_record(NodeControl, kv.value)

    async def _node_control(self, node: str) -> NodeControl:
        kv = await self.metastore.get(self.control.node_control(node))
        return NodeControl() if kv is None else parse_record(NodeControl, kv.value)
