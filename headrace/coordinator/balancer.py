"""Balancer: a pure policy deciding graceful pchannel moves.

:func:`plan` looks at where every pchannel is (or is about to be) served and
returns at most ``max_moves_per_round`` :class:`Move` s, in this order of
priority:

1. **Drain**: every movable pchannel of a draining node goes to the least
   loaded eligible node.
2. **Count fairness**: among eligible nodes (alive, not frozen, not draining)
   a pchannel moves from the most to the least loaded node while their counts
   differ by two or more. Ends with ``max - min <= 1`` whenever the movable
   pchannels allow it.
3. **Collection spread** (tie-breaker): with counts fair, a pchannel moves
   from a node with one more pchannel to a node with one fewer when that
   strictly lowers how concentrated collections are (the sum over nodes and
   collections of the squared number of pchannels carrying that collection).

Each move strictly lowers the tuple (pchannels on draining nodes, sum of
squared counts on eligible nodes, collection concentration), so repeated
rounds converge. Frozen nodes neither receive nor give (except by drain);
a pchannel never goes to a node in its ``barred`` set;
lagging or mid-transition pchannels never move but still count as load;
pinned ones (placed by an operator's move request) move only when no other
pchannel can restore fairness;
in-flight transitions use up the round's move budget. ``suspended`` returns
no moves. Ties are broken by names, so equal inputs give equal plans.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping


@dataclasses.dataclass(frozen=True, slots=True)
class Placement:
    """Where one pchannel is served, as the balancer sees it.

    ``owner``: the node serving it or about to serve it; empty if unplaced.
    ``in_transition``: an assignment or move is under way (never moved again).
    ``lagging``: the owner is behind on it (never moved).
    ``pinned``: an operator placed it there; fairness moves pick other
    pchannels first and collection spreading leaves it alone (a drain moves it).
    ``barred``: nodes that must never receive it (they cannot read its log or
    write the cluster's message format, see :func:`headrace.coordinator.reconcile.ineligibility`).
    """

    owner: str
    in_transition: bool = False
    lagging: bool = False
    collections: frozenset[str] = frozenset()
    pinned: bool = False
    barred: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True, slots=True)
class NodeStatus:
    """A live node; dead nodes are simply absent from the node map."""

    frozen: bool = False
    draining: bool = False

    @property
    def eligible(self) -> bool:
        return not self.frozen and not self.draining


@dataclasses.dataclass(frozen=True, slots=True)
class BalanceConfig:
    max_moves_per_round: int = 2
    suspended: bool = False


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class Move:
    pchannel: str
    source: str
    target: str


class _Layout:
    """Mutable working copy of counts and collections, updated move by move."""

    def __init__(self, layout: Mapping[str, Placement], nodes: Mapping[str, NodeStatus]) -> None:
        self.placements = dict(layout)
        self.nodes = nodes
        self.counts: Counter[str] = Counter({node: 0 for node in nodes})
        self.spread: dict[str, Counter[str]] = {node: Counter() for node in nodes}
        for placement in layout.values():
            if placement.owner in nodes:
                self.counts[placement.owner] += 1
                self.spread[placement.owner].update(placement.collections)
        self.eligible = sorted(node for node, status in nodes.items() if status.eligible)

    def movable_on(self, node: str) -> list[str]:
        return sorted(
            name
            for name, placement in self.placements.items()
            if placement.owner == node and not placement.in_transition and not placement.lagging
        )

    def may_take(self, pchannel: str, node: str) -> bool:
        return node not in self.placements[pchannel].barred

    def collection_delta(self, pchannel: str, source: str, target: str) -> int:
        """Change of the collection concentration if ``pchannel`` moved."""
        collections = self.placements[pchannel].collections
        return sum(
            2 * (self.spread[target][name] - self.spread[source][name] + 1) for name in collections
        )

    def apply(self, move: Move) -> None:
        placement = self.placements[move.pchannel]
        self.counts[move.source] -= 1
        self.counts[move.target] += 1
        self.spread[move.source].subtract(placement.collections)
        self.spread[move.target].update(placement.collections)
        self.placements[move.pchannel] = dataclasses.replace(
            placement, owner=move.target, in_transition=True
        )


def choose_target(
    counts: Mapping[str, int],
    candidates: Iterable[str],
    collections: frozenset[str] = frozenset(),
    spread: Mapping[str, Mapping[str, int]] | None = None,
) -> str | None:
    """The least loaded candidate; ties go to the node carrying the fewest of
    ``collections``, then to the smallest name. None without candidates."""

    def key(node: str) -> tuple[int, int, str]:
        held = spread.get(node, {}) if spread is not None else {}
        overlap = sum(held.get(name, 0) for name in collections)
        return (counts.get(node, 0), overlap, node)

    ordered = sorted(candidates, key=key)
    return ordered[0] if ordered else None


def _drain_move(work: _Layout) -> Move | None:
    for node in sorted(work.nodes):
        if not work.nodes[node].draining:
            continue
        for pchannel in work.movable_on(node):
            takers = [n for n in work.eligible if work.may_take(pchannel, n)]
            target = choose_target(
                work.counts, takers, work.placements[pchannel].collections, work.spread
            )
            if target is not None:
                return Move(pchannel, node, target)
    return None


def _count_move(work: _Layout) -> Move | None:
    if len(work.eligible) < 2:
        return None
    low = min(work.eligible, key=lambda node: (work.counts[node], node))
    donors = sorted(work.eligible, key=lambda node: (-work.counts[node], node))
    for source in donors:
        if work.counts[source] - work.counts[low] < 2:
            break
        candidates = [p for p in work.movable_on(source) if work.may_take(p, low)]
        if candidates:
            best = min(
                candidates,
                key=lambda p: (work.placements[p].pinned, work.collection_delta(p, source, low), p),
            )
            return Move(best, source, low)
    return None


def _spread_move(work: _Layout) -> Move | None:
    best: tuple[int, Move] | None = None
    for source in work.eligible:
        for target in work.eligible:
            if work.counts[source] - work.counts[target] != 1:
                continue
            for pchannel in work.movable_on(source):
                if work.placements[pchannel].pinned or not work.may_take(pchannel, target):
                    continue
                delta = work.collection_delta(pchannel, source, target)
                candidate = (delta, Move(pchannel, source, target))
                if delta < 0 and (best is None or candidate < best):
                    best = candidate
    return None if best is None else best[1]


def drain_moves(
    layout: Mapping[str, Placement], nodes: Mapping[str, NodeStatus], config: BalanceConfig
) -> list[Move]:
    """Only the drain moves of :func:`plan`, ignoring ``suspended`` (an
    explicit drain request is carried out even while balancing is off)."""
    work = _Layout(layout, nodes)
    moves: list[Move] = []
    while len(moves) < _budget(layout, config):
        move = _drain_move(work)
        if move is None:
            break
        work.apply(move)
        moves.append(move)
    return moves


def plan(
    layout: Mapping[str, Placement], nodes: Mapping[str, NodeStatus], config: BalanceConfig
) -> list[Move]:
    """The moves of one balancing round (see the module docstring)."""
    if config.suspended:
        return []
    work = _Layout(layout, nodes)
    moves: list[Move] = []
    budget = _budget(layout, config)
    while len(moves) < budget:
        move = _drain_move(work) or _count_move(work) or _spread_move(work)
        if move is None:
            break
        work.apply(move)
        moves.append(move)
    return moves


def _budget(layout: Mapping[str, Placement], config: BalanceConfig) -> int:
    in_flight = sum(1 for placement in layout.values() if placement.in_transition)
    return max(0, config.max_moves_per_round - in_flight)


def is_balanced(layout: Mapping[str, Placement], nodes: Mapping[str, NodeStatus]) -> bool:
    """Counts on eligible nodes differ by at most one and draining nodes hold nothing."""
    work = _Layout(layout, nodes)
    if any(work.counts[node] for node, status in nodes.items() if status.draining):
        return False
    counts = [work.counts[node] for node in work.eligible]
    return not counts or max(counts) - min(counts) <= 1
