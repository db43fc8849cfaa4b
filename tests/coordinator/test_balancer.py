"""Property tests of the pure balancer policy."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.coordinator.balancer import (
    BalanceConfig,
    Move,
    NodeStatus,
    Placement,
    choose_target,
    drain_moves,
    is_balanced,
    plan,
)

Cluster = tuple[dict[str, Placement], dict[str, NodeStatus]]
NODE_NAMES = [f"n{i}" for i in range(6)]
COLLECTIONS = ["c0", "c1", "c2", "c3"]


@st.composite
def clusters(draw: st.DrawFn, *, movable_only: bool = False) -> Cluster:
    names = draw(st.lists(st.sampled_from(NODE_NAMES), min_size=1, max_size=6, unique=True))
    nodes = {
        name: NodeStatus(frozen=draw(st.booleans()), draining=draw(st.booleans())) for name in names
    }
    owners = st.sampled_from([*names, "", "dead"])
    count = draw(st.integers(0, 24))
    layout = {}
    for i in range(count):
        layout[f"p{i:02d}"] = Placement(
            owner=draw(owners),
            in_transition=False if movable_only else draw(st.booleans()),
            lagging=False if movable_only else draw(st.booleans()),
            collections=frozenset(draw(st.sets(st.sampled_from(COLLECTIONS), max_size=2))),
        )
    return layout, nodes


configs = st.builds(BalanceConfig, max_moves_per_round=st.integers(1, 5))


@settings(max_examples=150, deadline=None)
@given(clusters(), configs)
def test_moves_stay_within_bounds(cluster: Cluster, config: BalanceConfig) -> None:
    layout, nodes = cluster
    moves = plan(layout, nodes, config)
    in_flight = sum(1 for p in layout.values() if p.in_transition)
    assert len(moves) <= max(0, config.max_moves_per_round - in_flight)
    assert len({move.pchannel for move in moves}) == len(moves)
    for move in moves:
        placement = layout[move.pchannel]
        assert move.source == placement.owner
        assert move.source != move.target
        assert not placement.in_transition and not placement.lagging
        assert move.target in nodes, "never targets a dead node"
        assert nodes[move.target].eligible, "never targets a frozen or draining node"
        if not nodes[move.source].eligible:
            assert nodes[move.source].draining, "frozen nodes give nothing unless draining"


@settings(max_examples=100, deadline=None)
@given(clusters(), configs)
def test_suspended_returns_nothing(cluster: Cluster, config: BalanceConfig) -> None:
    layout, nodes = cluster
    assert plan(layout, nodes, dataclasses.replace(config, suspended=True)) == []


@settings(max_examples=100, deadline=None)
@given(clusters(), configs)
def test_deterministic_for_equal_inputs(cluster: Cluster, config: BalanceConfig) -> None:
    layout, nodes = cluster
    first = plan(layout, nodes, config)
    reordered_layout = dict(reversed(list(layout.items())))
    reordered_nodes = dict(reversed(list(nodes.items())))
    assert plan(reordered_layout, reordered_nodes, config) == first
    assert plan(dict(layout), dict(nodes), config) == first


def _apply(layout: dict[str, Placement], moves: list[Move]) -> dict[str, Placement]:
    after = dict(layout)
    for move in moves:
        after[move.pchannel] = dataclasses.replace(after[move.pchannel], owner=move.target)
    return after


@settings(max_examples=100, deadline=None)
@given(clusters(movable_only=True), configs)
def test_converges_to_balance(cluster: Cluster, config: BalanceConfig) -> None:
    layout, nodes = cluster
    # Every move strictly lowers a bounded potential, so the number of moves is
    # bounded by (pchannels on draining nodes) + (sum of squared counts) +
    # (collection concentration); this bound is far above what is needed.
    limit = 1 + len(layout) * (1 + len(layout) * (1 + 2 * len(COLLECTIONS)))
    rounds = 0
    while moves := plan(layout, nodes, config):
        layout = _apply(layout, moves)
        rounds += 1
        assert rounds <= limit
    if any(status.eligible for status in nodes.values()):
        assert is_balanced(layout, nodes)
        assert not any(
            p.owner == node for p in layout.values() for node, s in nodes.items() if s.draining
        )


@settings(max_examples=100, deadline=None)
@given(clusters(movable_only=True))
def test_fixpoint_is_stable_and_fair(cluster: Cluster) -> None:
    layout, nodes = cluster
    config = BalanceConfig(max_moves_per_round=1000)
    while moves := plan(layout, nodes, config):
        layout = _apply(layout, moves)
    counts = {
        node: sum(1 for p in layout.values() if p.owner == node)
        for node, status in nodes.items()
        if status.eligible
    }
    if counts:
        assert max(counts.values()) - min(counts.values()) <= 1


def test_sixteen_over_three_from_one_node() -> None:
    nodes = {name: NodeStatus() for name in ("a", "b", "c")}
    layout = {f"p{i:02d}": Placement(owner="a") for i in range(16)}
    config = BalanceConfig(max_moves_per_round=2)
    rounds = 0
    while moves := plan(layout, nodes, config):
        assert len(moves) <= 2
        layout = _apply(layout, moves)
        rounds += 1
    counts = sorted(sum(1 for p in layout.values() if p.owner == n) for n in nodes)
    assert counts == [5, 5, 6]
    assert rounds == 5  # 10 moves needed, two per round


def test_in_flight_transitions_use_the_budget() -> None:
    nodes = {"a": NodeStatus(), "b": NodeStatus()}
    layout = {f"p{i}": Placement(owner="a") for i in range(6)}
    layout["p9"] = Placement(owner="b", in_transition=True)
    assert len(plan(layout, nodes, BalanceConfig(max_moves_per_round=2))) == 1
    assert plan(layout, nodes, BalanceConfig(max_moves_per_round=1)) == []


def test_lagging_pchannels_stay() -> None:
    nodes = {"a": NodeStatus(), "b": NodeStatus()}
    layout = {f"p{i}": Placement(owner="a", lagging=i != 3) for i in range(4)}
    assert plan(layout, nodes, BalanceConfig(max_moves_per_round=4)) == [Move("p3", "a", "b")]


def test_drain_moves_everything_off_and_frozen_receives_nothing() -> None:
    nodes = {
        "a": NodeStatus(frozen=True, draining=True),
        "b": NodeStatus(frozen=True),
        "c": NodeStatus(),
        "d": NodeStatus(),
    }
    layout = {f"p{i}": Placement(owner="a") for i in range(4)}
    layout["q"] = Placement(owner="b")
    moves = plan(layout, nodes, BalanceConfig(max_moves_per_round=10))
    assert sorted(move.pchannel for move in moves) == ["p0", "p1", "p2", "p3"]
    assert {move.target for move in moves} == {"c", "d"}
    # Drains are carried out even with balancing suspended.
    suspended = BalanceConfig(max_moves_per_round=10, suspended=True)
    assert drain_moves(layout, nodes, suspended) == moves


def test_pinned_pchannels_move_last() -> None:
    nodes = {"a": NodeStatus(), "b": NodeStatus()}
    layout = {
        "p0": Placement(owner="b", pinned=True),
        "p1": Placement(owner="b"),
        "p2": Placement(owner="b"),
    }
    assert plan(layout, nodes, BalanceConfig()) == [Move("p1", "b", "a")]
    only_pinned = {"p0": Placement(owner="b", pinned=True), "p1": Placement(owner="b", pinned=True)}
    assert plan(only_pinned, nodes, BalanceConfig()) == [Move("p0", "b", "a")]


def test_spreads_collections_among_equal_counts() -> None:
    nodes = {"a": NodeStatus(), "b": NodeStatus()}
    layout = {
        "p0": Placement(owner="a", collections=frozenset({"orders"})),
        "p1": Placement(owner="a", collections=frozenset({"orders"})),
        "p2": Placement(owner="b", collections=frozenset({"users"})),
    }
    # Counts are already fair (2/1), but both "orders" shards sit on a.
    moves = plan(layout, nodes, BalanceConfig())
    assert moves == [Move("p0", "a", "b")]
    after = _apply(layout, moves)
    assert plan(after, nodes, BalanceConfig()) == []


def test_choose_target_prefers_fewer_of_the_same_collection() -> None:
    counts = {"a": 1, "b": 1, "c": 2}
    spread = {"a": {"orders": 1}, "b": {}, "c": {}}
    assert choose_target(counts, ["a", "b", "c"], frozenset({"orders"}), spread) == "b"
    assert choose_target(counts, ["a", "b", "c"]) == "a"
    assert choose_target(counts, []) is None
