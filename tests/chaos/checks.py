"""What every short chaos run in the suite must show, whatever the backend."""

from __future__ import annotations

import json
from typing import Any

from headrace.bench import chaos


def assert_clean(result: dict[str, Any]) -> None:
    """Traffic flowed, no invariant broke, and every kind of fault happened."""
    summary = json.dumps({k: v for k, v in result.items() if k != "node_starts"})
    assert result["acked"] > 0, summary
    assert chaos.violations(result) == {}, summary
    assert result["caught_up"] and not result["consumer_errors"], summary
    assert result["foreign_deliveries"] == 0, summary
    assert not result["fault_errors"], summary
    assert result["acked_missing_from_wal"] == 0 and result["duplicates_in_wal"] == 0, summary
    assert result["wal_records"] >= result["acked"], summary
    faults = result["faults"]
    assert faults["kill"] >= 1 and faults["stop"] >= 1 and faults["move"] >= 1, summary
