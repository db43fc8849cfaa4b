"""Starting a test-bed server from a fixture: the test fails, with the test
bed's reason, when the server cannot be built or started."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

from headrace_testbed import TestbedError

T = TypeVar("T")


def start_or_fail(what: str, start: Callable[[], T]) -> T:
    """``start()``; on a :class:`TestbedError` fail the test with ``cannot {what}: why``."""
    try:
        return start()
    except TestbedError as exc:
        pytest.fail(f"cannot {what}: {exc}", pytrace=False)
