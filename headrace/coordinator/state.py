"""The per-pchannel assignment state machine, as pure functions.

Edges (C: written by the coordinator, N: written by the node)::

    absent      -> ASSIGNING(t >= 1, n)  C  first assignment
    absent      -> UNAVAILABLE(0)        C  no eligible node
    ASSIGNING   -> ASSIGNED(same t, n)   N  WAL opened under t
    ASSIGNED    -> UNASSIGNING(t, n, x)  C  graceful move towards x
    UNASSIGNING -> UNASSIGNED(t)         N  drained and closed
    UNASSIGNED  -> ASSIGNING(t + 1, m)   C  second half of a move
    UNAVAILABLE -> ASSIGNING(t + 1, m)   C  a node became eligible
    any         -> ASSIGNING(t' > t, m)  C  failover (owner's session gone) or
                                            retry of a stuck transition
    any         -> UNAVAILABLE(t)        C  nobody can take it now

Every assignment takes a term greater than every earlier term of the pchannel;
terms never decrease on any edge (:func:`check_transition`). The backends
fence by term, so a crashed or stuck owner cannot write after a failover.
"""

from __future__ import annotations

from headrace import errors
from headrace.cluster import ACTIVE_STATES, Assignment, AssignmentState, NodeInfo

IDLE_STATES = frozenset({AssignmentState.UNASSIGNED, AssignmentState.UNAVAILABLE})
"""States in which nobody serves the pchannel."""


def current_term(record: Assignment | None) -> int:
    return 0 if record is None else record.term


def holder(record: Assignment | None) -> str:
    """The node that holds or is opening the WAL; empty when nobody does."""
    if record is None or record.state not in ACTIVE_STATES:
        return ""
    return record.node


def destination(record: Assignment | None) -> str:
    """The node the pchannel is on, or is on its way to (UNASSIGNING target)."""
    if record is None or record.state in IDLE_STATES:
        return ""
    if record.state is AssignmentState.UNASSIGNING:
        return record.target
    return record.node


def is_stable(record: Assignment | None) -> bool:
    return record is not None and record.state is AssignmentState.ASSIGNED


def assign(pchannel: str, record: Assignment | None, node: NodeInfo, now: float) -> Assignment:
    """ASSIGNING on ``node`` under a fresh term (first assignment, second half
    of a move, failover, or retry of a stuck transition)."""
    return Assignment(
        pchannel=pchannel,
        state=AssignmentState.ASSIGNING,
        term=current_term(record) + 1,
        node=node.node_id,
        address=node.address,
        updated_at=now,
    )


def unavailable(
    pchannel: str, record: Assignment | None, now: float, reason: str = ""
) -> Assignment:
    """Nobody can take the pchannel now (``reason`` says why); the term is kept
    (the next assignment takes ``term + 1``)."""
    return Assignment(
        pchannel=pchannel,
        state=AssignmentState.UNAVAILABLE,
        term=current_term(record),
        updated_at=now,
        reason=reason,
    )


def start_move(record: Assignment, target: str, now: float) -> Assignment:
    """ASSIGNED -> UNASSIGNING(target): the owner drains, then releases."""
    if record.state is not AssignmentState.ASSIGNED:
        raise errors.InvalidArgument(
            f"cannot move {record.pchannel}: it is {record.state.value}, not ASSIGNED"
        )
    if target == record.node:
        raise errors.InvalidArgument(f"{record.pchannel} is already on {target}")
    return record.model_copy(
        update={"state": AssignmentState.UNASSIGNING, "target": target, "updated_at": now}
    )


def acknowledge(record: Assignment, now: float) -> Assignment:
    """What the node writes once it has done its part: ASSIGNING -> ASSIGNED,
    UNASSIGNING -> UNASSIGNED (keeping the target as a hint)."""
    if record.state is AssignmentState.ASSIGNING:
        return record.model_copy(update={"state": AssignmentState.ASSIGNED, "updated_at": now})
    if record.state is AssignmentState.UNASSIGNING:
        return record.model_copy(update={"state": AssignmentState.UNASSIGNED, "updated_at": now})
    raise errors.InvalidArgument(f"nothing to acknowledge for {record.pchannel} in {record.state}")


def check_transition(previous: Assignment | None, following: Assignment) -> None:
    """Raise InvalidArgument unless ``previous -> following`` is an edge above."""
    problem = transition_error(previous, following)
    if problem:
        raise errors.InvalidArgument(problem)


_PREDECESSOR = {
    AssignmentState.ASSIGNED: AssignmentState.ASSIGNING,
    AssignmentState.UNASSIGNING: AssignmentState.ASSIGNED,
    AssignmentState.UNASSIGNED: AssignmentState.UNASSIGNING,
}


def transition_error(previous: Assignment | None, following: Assignment) -> str:
    """Why ``previous -> following`` is not an edge above; empty if it is."""
    before = current_term(previous)
    name = following.pchannel
    new = following.state
    if previous is not None and previous.pchannel != name:
        return f"record of {previous.pchannel} replaced by one of {name}"
    if following.term < before:
        return f"{name}: term would go back from {before} to {following.term}"
    if new is AssignmentState.ASSIGNING:
        if following.term <= before or not following.node:
            return f"{name}: ASSIGNING needs a node and a term above {before}"
        return ""
    if new is AssignmentState.UNAVAILABLE:
        return "" if following.term == before else f"{name}: UNAVAILABLE keeps the term {before}"
    if previous is None:
        return f"{name}: a new record must be ASSIGNING or UNAVAILABLE"
    if previous.state is not _PREDECESSOR[new]:
        return f"{name}: {new.value} cannot follow {previous.state.value}"
    if following.term != before:
        return f"{name}: {new.value} must keep the term {before}"
    if new is not AssignmentState.UNASSIGNED and following.node != previous.node:
        return f"{name}: {new.value} must keep the node {previous.node}"
    return ""
