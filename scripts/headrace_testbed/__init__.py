"""Real servers for the test suites, built or downloaded once and cached.

Everything listens on loopback only and lives under
``${XDG_CACHE_HOME:-~/.cache}/headrace`` (see :mod:`headrace_testbed.cache`).
The pytest configuration puts ``scripts/`` on ``sys.path`` so tests can
``import headrace_testbed``.
"""

from __future__ import annotations

__all__ = ["TestbedError"]


class TestbedError(RuntimeError):
    """A test server could not be built, started or reached; the message says why."""

    __test__ = False
