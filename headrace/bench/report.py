"""The report of the WAL benchmark: per-round ratios and the printed summary (pure).

:mod:`headrace.bench.wal` measures; the functions here turn its per-round
figures and per-batch latencies (seconds) into the JSON fields it prints.
"""

from __future__ import annotations

import statistics
from typing import Any


def rate(count: int, elapsed: float) -> float:
    """``count`` per second of ``elapsed`` (0 for no time)."""
    return count / elapsed if elapsed > 0 else 0.0


def percentile(samples: list[float], q: float) -> float:
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def ms(seconds: float) -> float:
    return seconds * 1000


def txn_round_figures(
    msgs_per_s: float, p99_ms: float, txn_rate: float, txn_latencies: list[float]
) -> dict[str, float]:
    """One round's figures against the transactional baseline (rates in msgs/s)."""
    txn_p99_ms = ms(percentile(txn_latencies, 0.99))
    return {
        "baseline_txn": txn_rate,
        "ratio_vs_txn": msgs_per_s / txn_rate if txn_rate else 0.0,
        "baseline_txn_p99_ms": txn_p99_ms,
        "p99_overhead_vs_txn_ms": p99_ms - txn_p99_ms,
    }


def txn_summary(
    per_round: list[dict[str, float]], txn_latencies: list[float], summary_p99: float
) -> dict[str, float]:
    """The WAL against Kafka's transactional baseline.

    ``per_round`` holds each round's :func:`txn_round_figures`;
    ``txn_latencies`` are the batch latencies (s) of the fastest transactional
    baseline round and ``summary_p99`` the WAL's p99 (ms, not rounded). The rate is
    the best round's, ``ratio_vs_txn`` the median of the rounds' own ratios,
    ``p99_overhead_vs_txn_ms`` the WAL's p99 minus the baseline's.
    """
    txn_p99 = ms(percentile(txn_latencies, 0.99))
    return {
        "baseline_txn_msgs_per_s": round(max(x["baseline_txn"] for x in per_round), 1),
        "ratio_vs_txn": round(statistics.median(x["ratio_vs_txn"] for x in per_round), 3),
        "baseline_txn_p50_ms": round(ms(statistics.median(txn_latencies)), 3),
        "baseline_txn_p99_ms": round(txn_p99, 3),
        "p99_overhead_vs_txn_ms": round(summary_p99 - txn_p99, 3),
    }


def broker_summary(
    per_round: list[dict[str, float]], base_latencies: list[float], summary_p99: float
) -> dict[str, Any]:
    """The raw producer's latencies (fastest baseline round), and the WAL's
    p99 overhead over them (each round's own difference is in ``rounds``)."""
    base_p99 = ms(percentile(base_latencies, 0.99))
    extra: dict[str, Any] = {
        "baseline_p50_ms": round(ms(statistics.median(base_latencies)), 3),
        "baseline_p99_ms": round(base_p99, 3),
        "p99_overhead_ms": round(summary_p99 - base_p99, 3),
    }
    if all("baseline_2p" in x for x in per_round):
        extra["baseline_msgs_per_s_2p"] = round(max(x["baseline_2p"] for x in per_round), 1)
    return extra


def summary(
    setup: dict[str, Any], per_round: list[dict[str, float]], latencies: list[float]
) -> dict[str, Any]:
    def best(key: str) -> float:
        return max(x[key] for x in per_round)

    # Each round's ratio compares runs made back to back (the disk's speed
    # drifts on a shared machine); the median round is reported.
    for x in per_round:
        x["ratio"] = x["msgs_per_s"] / x["baseline"] if x["baseline"] else 0.0
        if "msgs_per_s_2p" in x:
            # Brokers measure a two-in-flight baseline of their own.
            base = x.get("baseline_2p", x["baseline"])
            x["ratio_2p"] = x["msgs_per_s_2p"] / base if base else 0.0
    extra: dict[str, float] = {}
    if all("ratio_2p" in x for x in per_round):
        extra["msgs_per_s_2p"] = round(best("msgs_per_s_2p"), 1)
        extra["ratio_2p"] = round(statistics.median(x["ratio_2p"] for x in per_round), 3)
    return {
        **setup,
        "msgs_per_s": round(best("msgs_per_s"), 1),
        "baseline_msgs_per_s": round(best("baseline"), 1),
        "ratio": round(statistics.median(x["ratio"] for x in per_round), 3),
        **extra,
        "p50_ms": round(statistics.median(latencies) * 1000, 3) if latencies else 0.0,
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 3),
        "scan_msgs_per_s": round(best("scan"), 1),
        "scan_decoded_msgs_per_s": round(best("scan_decoded"), 1),
        "backend_append_msgs_per_s": round(best("backend"), 1),
        "backend_scan_records_per_s": round(best("scan_backend"), 1),
        "decode_msgs_per_s": round(best("decode"), 1),
        "rounds": [
            {
                k: round(v, 3 if k.startswith("ratio") or k.endswith("_ms") else 1)
                for k, v in x.items()
            }
            for x in per_round
        ],
    }
