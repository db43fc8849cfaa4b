"""vchannel → pchannel routing: the rule is recorded in the cluster config."""

from __future__ import annotations

import zlib

from hypothesis import given
from hypothesis import strategies as st

from headrace.cluster import (
    NEW_CLUSTER_ROUTING,
    ClusterConfig,
    Routing,
    default_pchannels,
    mixed_hash,
    route,
)


def test_a_config_recorded_without_a_rule_keeps_crc32_and_new_clusters_use_shards() -> None:
    legacy = ClusterConfig.from_json(b'{"pchannels":["p-0","p-1","p-2"],"wal_backend":"local"}')
    assert legacy.routing is Routing.CRC32
    for name in ("orders-0", "orders-1", "v", "anything"):
        assert legacy.route(name) == ["p-0", "p-1", "p-2"][zlib.crc32(name.encode()) % 3]
    assert NEW_CLUSTER_ROUTING is Routing.SHARDS
    again = ClusterConfig.from_json(
        ClusterConfig(pchannels=["p-0"], routing=NEW_CLUSTER_ROUTING).to_json()
    )
    assert again.routing is Routing.SHARDS


def test_crc32_puts_four_consecutive_shards_on_two_of_four_pchannels() -> None:
    """The defect the recorded rule fixes, pinned so the reason stays visible."""
    pchannels = default_pchannels(4)
    crc = {route(f"orders-{i}", pchannels, Routing.CRC32) for i in range(4)}
    shards = {route(f"orders-{i}", pchannels, Routing.SHARDS) for i in range(4)}
    assert len(crc) == 2
    assert shards == set(pchannels)


@given(
    base=st.from_regex(r"[A-Za-z0-9_]{1,40}", fullmatch=True),
    count=st.integers(min_value=1, max_value=64),
)
def test_n_shards_of_a_collection_cover_n_pchannels(base: str, count: int) -> None:
    for shards in (1, count // 2 + 1, count, count + 3):
        pchannels = default_pchannels(count)
        hit = {route(f"{base}-{i}", pchannels, Routing.SHARDS) for i in range(shards)}
        assert len(hit) == min(shards, count)


def test_other_names_spread_and_the_hash_is_pinned() -> None:
    # Pinned values: a change of the rule would move every vchannel of a cluster.
    assert mixed_hash("orders") == 0x88DEF888
    assert mixed_hash("") == 0
    pchannels = default_pchannels(8)
    counts: dict[str, int] = {}
    for i in range(8000):
        p = route(f"v{i}x", pchannels, Routing.SHARDS)
        counts[p] = counts.get(p, 0) + 1
    assert set(counts) == set(pchannels)
    assert max(counts.values()) < 1.2 * min(counts.values())
