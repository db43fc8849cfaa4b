"""The operator's metrics: a pass's outcome label and what a pass records."""

from __future__ import annotations

from headrace_operator.metrics import OperatorMetrics, pass_outcome
from headrace_operator.results import DONE, Halt, PassResult, failed, halted, waiting_on


def test_the_deciding_step_names_the_outcome() -> None:
    assert pass_outcome(None) == "gone"
    assert pass_outcome(PassResult(steps=(("a", DONE), ("b", DONE)))) == "done"
    assert pass_outcome(PassResult(steps=(("a", DONE), ("b", waiting_on("pods"))))) == "waiting"
    broken = failed("x", retryable=True)
    assert pass_outcome(PassResult(steps=(("a", broken), ("b", waiting_on("y"))))) == "failed"
    paused = halted(Halt.PAUSED, "annotation")
    assert pass_outcome(PassResult(steps=(("a", paused), ("b", broken)))) == "halted"


def test_a_pass_counts_its_outcome_duration_and_failed_steps() -> None:
    metrics = OperatorMetrics()
    result = PassResult(steps=(("pods", failed("x", retryable=True)), ("status", DONE)))
    metrics.observed("StreamingCluster", result, 0.2)
    metrics.failed("UpgradePlan", retryable=False, seconds=0.1)
    value = metrics.registry.get_sample_value
    assert (
        value(
            "headrace_operator_reconcile_total", {"kind": "StreamingCluster", "outcome": "failed"}
        )
        == 1
    )
    assert (
        value("headrace_operator_step_failures_total", {"kind": "StreamingCluster", "step": "pods"})
        == 1
    )
    assert (
        value(
            "headrace_operator_reconcile_errors_total",
            {"kind": "UpgradePlan", "retryable": "false"},
        )
        == 1
    )
    assert value("headrace_operator_reconcile_duration_seconds_count", {"kind": "UpgradePlan"}) == 1
