"""What every short chaos run in the suite must show, whatever the backend."""

from __future__ import annotations

import json
from typing import Any

from headrace.bench import chaos

NODE_FAULTS = ("kill", "stop", "move")


def assert_clean(
    result: dict[str, Any],
    fault_kinds: tuple[str, ...] = NODE_FAULTS,
    *,
    rewrites_stored: bool = False,
) -> None:
    """Traffic flowed, no invariant broke, and each of ``fault_kinds`` happened.

    ``rewrites_stored``: the backend may store a record twice when its client
    resends after a stalled connection (Pulsar without broker deduplication,
    docs/backends.md): then every timetick regression and every duplicate in
    the log must be such an exact rewrite, and delivery stays exactly once."""
    summary = json.dumps({k: v for k, v in result.items() if k != "node_starts"})
    assert result["acked"] > 0, summary
    if rewrites_stored:
        rewritten = result["rewritten_records"]
        assert result["timetick_regressions"] == rewritten, summary
        assert result["duplicates_in_wal"] == rewritten, summary
        result = {**result, "timetick_regressions": 0, "duplicates_in_wal": 0}
    assert chaos.violations(result) == {}, summary
    assert result["caught_up"] and not result["consumer_errors"], summary
    assert result["foreign_deliveries"] == 0, summary
    assert not result["fault_errors"], summary
    assert result["acked_missing_from_wal"] == 0 and result["duplicates_in_wal"] == 0, summary
    assert result["wal_records"] >= result["acked"], summary
    faults = result["faults"]
    assert all(faults.get(kind, 0) >= 1 for kind in fault_kinds), summary
