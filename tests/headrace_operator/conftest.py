"""Fixtures of the operator tests: the step test bed (``bed``).

The real Kubernetes test bed (``kube_cluster``, ``helm_cli``) comes from the
root plugin ``tests.fixtures_kube``, shared by the whole session.
"""

from tests.headrace_operator.op_harness import bed

__all__ = ["bed"]
