"""Benchmarks measured against baselines taken in the same run (see BENCHMARKS.md)."""
