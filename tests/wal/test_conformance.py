"""Run the backend conformance suite on every backend of ``conftest.BACKENDS``."""

from __future__ import annotations

from .conformance import BackendConformance


class TestBackendConformance(BackendConformance):
    pass
