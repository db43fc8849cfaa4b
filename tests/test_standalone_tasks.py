"""A standalone whose coordinator or node supervision fails stops at once.

The failure is injected in-process (``headrace standalone`` run through the
CLI's ``main`` in this process, its nodes real processes): the coordinator
raising or returning after the standalone announced itself ready, a node
supervisor failing while it starts its node. The standalone must stop with a
non-zero exit code and a message naming the cause, instead of running on
without failover (or waiting out a start-up timeout).
"""

from __future__ import annotations

import _thread
import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from headrace import standalone
from headrace.cli.main import main
from headrace.coordinator.coordinator import Coordinator

original_run = Coordinator.run

SETTLE_AFTER_READY = 1.5
"""Seconds the injected coordinator keeps serving after every pchannel is
served, so that the standalone has announced itself before it fails."""

HANG_GUARD = 120.0


async def _serve_then(self: Coordinator, stop: asyncio.Event) -> None:
    """Run the real coordinator until the standalone is ready, then stop it."""
    inner = asyncio.Event()
    task = asyncio.create_task(original_run(self, inner))
    await standalone.wait_all_assigned(self.metastore, "default", 2, 60.0)
    await asyncio.sleep(SETTLE_AFTER_READY)
    inner.set()
    await task


async def _dies_after_ready(self: Coordinator, stop: asyncio.Event) -> None:
    await _serve_then(self, stop)
    raise RuntimeError("injected coordinator defect")


@pytest.fixture
def hang_guard() -> Iterator[None]:
    """Fail the test (instead of hanging) if the standalone never stops."""
    done = threading.Event()

    def interrupt() -> None:
        if not done.wait(HANG_GUARD):
            _thread.interrupt_main()

    watchdog = threading.Thread(target=interrupt, daemon=True)
    watchdog.start()
    yield
    done.set()


def run_standalone_cli(data_dir: Path) -> int:
    return main(["standalone", "--data-dir", str(data_dir), "--nodes", "1", "--pchannels", "2"])


@pytest.mark.parametrize(
    "case",
    [
        (_dies_after_ready, "RuntimeError: injected coordinator defect"),
        (_serve_then, "the coordinator stopped on its own"),
    ],
    ids=["raises", "returns"],
)
def test_a_coordinator_failing_after_ready_stops_the_standalone(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    hang_guard: None,
    case: tuple[Callable[[Coordinator, asyncio.Event], Awaitable[None]], str],
) -> None:
    injected, cause = case
    monkeypatch.setattr(Coordinator, "run", injected)
    code = run_standalone_cli(tmp_path / "data")
    out, err = capsys.readouterr()
    assert "headrace standalone ready" in out
    assert code != 0
    assert "standalone stopping" in err
    assert cause in err
    assert "no failover" in err


def test_a_failing_node_supervisor_stops_the_standalone(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    hang_guard: None,
) -> None:
    async def broken_start(self: standalone.NodeProcess) -> None:
        raise RuntimeError("injected supervisor defect")

    monkeypatch.setattr(standalone.NodeProcess, "start", broken_start)
    code = run_standalone_cli(tmp_path / "data")
    _, err = capsys.readouterr()
    assert code != 0
    assert "supervisor of node-0 failed: RuntimeError: injected supervisor defect" in err
