"""Tests of the project's own test bed (real servers started by scripts/headrace_testbed)."""
