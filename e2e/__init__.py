"""End-to-end scenarios: the operator on a real API server (see README.md)."""
