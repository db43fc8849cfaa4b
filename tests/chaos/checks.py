"""What every short chaos run in the suite must show, whatever the backend."""

from __future__ import annotations

import json
from typing import Any

from headrace.bench import chaos

NODE_FAULTS = ("kill", "stop", "move")


def assert_clean(result: dict[str, Any], fault_kinds: tuple[str, ...] = NODE_FAULTS) -> None:
    """Traffic flowed, no invariant broke, and each of ``fault_kinds`` happened.

    The log holds each record once, whatever the backend: no rewrite of a
    record already stored (a resend stored twice), no other duplicate, no
    timetick regression."""
    summary = json.dumps({k: v for k, v in result.items() if k != "node_starts"})
    assert result["acked"] > 0, summary
    assert result["rewritten_records"] == 0, summary
    assert chaos.violations(result) == {}, summary
    assert result["caught_up"] and not result["consumer_errors"], summary
    assert result["foreign_deliveries"] == 0, summary
    assert not result["fault_errors"], summary
    assert result["acked_missing_from_wal"] == 0 and result["duplicates_in_wal"] == 0, summary
    assert result["wal_records"] >= result["acked"], summary
    faults = result["faults"]
    assert all(faults.get(kind, 0) >= 1 for kind in fault_kinds), summary
