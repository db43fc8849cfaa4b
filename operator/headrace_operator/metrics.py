"""The operator's Prometheus metrics: reconcile passes, their outcomes and steps.

Labels are bounded: the kind (StreamingCluster, UpgradePlan), the outcome of a
pass (done, waiting, failed, halted, gone, error), and step names (a fixed
list per kind). Objects are not labels: their names are unbounded; the
status, conditions and Events say which object is in which state.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from headrace.metrics import LATENCY_BUCKETS
from headrace_operator.results import PassResult


def pass_outcome(result: PassResult | None) -> str:
    """The outcome label of a pass (pure): what its deciding step reported."""
    if result is None:
        return "gone"
    decision = result.decision
    if decision is None:
        return "done"
    _name, step = decision
    if step.halt is not None:
        return "halted"
    if step.failures:
        return "failed"
    return "waiting"


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.passes = Counter(
            "headrace_operator_reconcile",
            "Reconcile passes by kind and outcome",
            ["kind", "outcome"],
            registry=r,
        )
        self.errors = Counter(
            "headrace_operator_reconcile_errors",
            "Passes that ended in an error (retryable or not) instead of a result",
            ["kind", "retryable"],
            registry=r,
        )
        self.seconds = Histogram(
            "headrace_operator_reconcile_duration_seconds",
            "Time of one reconcile pass",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.step_failures = Counter(
            "headrace_operator_step_failures",
            "Failures reported by a reconcile step",
            ["kind", "step"],
            registry=r,
        )

    def observed(self, kind: str, result: PassResult | None, seconds: float) -> None:
        self.passes.labels(kind, pass_outcome(result)).inc()
        self.seconds.labels(kind).observe(seconds)
        if result is not None:
            for name, step in result.steps:
                if step.failures:
                    self.step_failures.labels(kind, name).inc(len(step.failures))

    def failed(self, kind: str, *, retryable: bool, seconds: float) -> None:
        self.passes.labels(kind, "error").inc()
        self.errors.labels(kind, "true" if retryable else "false").inc()
        self.seconds.labels(kind).observe(seconds)
