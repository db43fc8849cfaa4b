"""Process tuning: the collector stays on, runs less often, and a tuned block
gives the previous settings back."""

from __future__ import annotations

import gc
import os
import platform
import subprocess
import sys
from collections.abc import Iterator

import pytest

from headrace import errors, runtime


@pytest.fixture
def restore_gc() -> Iterator[None]:
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    yield None
    gc.set_threshold(*thresholds)
    gc.unfreeze()
    if enabled:
        gc.enable()


def test_tune_gc_raises_thresholds_and_freezes_the_start_up_heap(restore_gc: object) -> None:
    gc.unfreeze()
    settings = runtime.tune_gc()
    assert settings.enabled and gc.isenabled()
    assert settings.thresholds == (runtime.GEN0_THRESHOLD, 20, 20) == gc.get_threshold()
    # Frozen objects can only go away (threads of earlier tests may free some
    # between the two reads), never come in without another freeze.
    assert 0 < gc.get_freeze_count() <= settings.frozen_objects
    assert runtime.gc_tuned()
    garbage: list[object] = []
    garbage.append(garbage)  # a reference cycle is still collected
    del garbage
    assert gc.collect() >= 1


def test_thresholds_must_be_positive(restore_gc: object) -> None:
    with pytest.raises(errors.InvalidArgument):
        runtime.tune_gc(0)


def test_a_tuned_block_restores_the_collector(restore_gc: object) -> None:
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    with runtime.gc_tuning() as settings:
        assert settings.thresholds[0] == runtime.GEN0_THRESHOLD
        assert runtime.gc_tuned() and gc.get_freeze_count() > 0
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0
    assert not runtime.gc_tuned()


def test_switch_interval_is_shortened_and_a_tuned_block_gives_it_back(
    restore_gc: object,
) -> None:
    before = sys.getswitchinterval()
    with runtime.process_tuning() as settings:
        assert sys.getswitchinterval() == pytest.approx(runtime.SWITCH_INTERVAL_S)
        assert settings.thresholds[0] == runtime.GEN0_THRESHOLD
    assert sys.getswitchinterval() == pytest.approx(before)
    with pytest.raises(errors.InvalidArgument):
        runtime.tune_switch_interval(0)
    previous = runtime.tune_switch_interval(0.002)
    try:
        assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(previous)


_FAULTS_PER_ROUND = """
import sys
from headrace import runtime
if sys.argv[1] == "tuned":
    assert runtime.tune_process().enabled
def minor_faults() -> int:
    with open("/proc/self/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[7])
parts = [bytes(1024)] * 512
for _ in range(5):
    b"".join(parts)
before = minor_faults()
for _ in range(50):
    first = b"".join(parts)
    second = b"".join(parts)
    del first, second
print((minor_faults() - before) / 50)
"""


def _faults_per_round(mode: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    done = subprocess.run(
        [sys.executable, "-c", _FAULTS_PER_ROUND, mode],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return float(done.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_a_tuned_process_reuses_freed_large_buffers_instead_of_faulting_them_in() -> None:
    # Two 512 KiB buffers made and dropped per round, as a client's request
    # and its serialised form are: 128 pages each that an untuned malloc
    # gives back to the kernel and faults in again, zeroed, every round.
    assert _faults_per_round("untuned") > 100
    assert _faults_per_round("tuned") < 20


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_tune_malloc_is_accepted_by_glibc() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    code = "from headrace import runtime; print(runtime.tune_malloc())"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "True"


@pytest.mark.parametrize(
    ("environ", "platform_name"),
    [
        ({"MALLOC_MMAP_THRESHOLD_": "131072"}, "linux"),
        ({"MALLOC_TRIM_THRESHOLD_": "0"}, "linux"),
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, "linux"),
        ({}, "darwin"),
        ({}, "win32"),
    ],
)
def test_malloc_is_left_as_the_environment_or_platform_has_it(
    environ: dict[str, str], platform_name: str
) -> None:
    assert runtime.malloc_tuning(environ, platform_name) == ()


def test_malloc_thresholds_on_linux() -> None:
    assert runtime.malloc_tuning({"GLIBC_TUNABLES": "glibc.rtld.x=1"}, "linux") == (
        (-3, runtime.MALLOC_MMAP_THRESHOLD),
        (-1, runtime.MALLOC_TRIM_THRESHOLD),
    )


def test_grpc_runs_without_the_event_engine_endpoints_unless_told_otherwise() -> None:
    assert runtime.grpc_tuning({}, grpc_loaded=False) == {
        "GRPC_EXPERIMENTS": "-event_engine_client,-event_engine_listener"
    }


@pytest.mark.parametrize(
    ("environ", "grpc_loaded"),
    [
        ({"GRPC_EXPERIMENTS": "event_engine_client"}, False),  # the operator's choice
        ({"GRPC_EXPERIMENTS": ""}, False),  # an empty choice is still one
        ({}, True),  # too late: gRPC read its configuration when it was imported
    ],
)
def test_grpc_is_left_as_the_environment_or_its_import_has_it(
    environ: dict[str, str], grpc_loaded: bool
) -> None:
    assert runtime.grpc_tuning(environ, grpc_loaded) == {}


def test_tune_grpc_keeps_the_operators_choice() -> None:
    chosen = {"GRPC_EXPERIMENTS": "event_engine_client"}
    assert runtime.tune_grpc(chosen) is False
    assert chosen == {"GRPC_EXPERIMENTS": "event_engine_client"}


def _python(code: str, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True
    )


def test_the_command_line_tunes_grpc_before_anything_imports_it() -> None:
    environ = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    done = _python(
        "import sys, os, headrace.cli.main\n"
        "assert 'grpc._cython.cygrpc' not in sys.modules, 'grpc imported before the tuning'\n"
        "import grpc.aio\n"
        "print(os.environ['GRPC_EXPERIMENTS'])",
        environ,
    )
    assert done.stdout.strip() == runtime.GRPC_EXPERIMENTS
    assert "experiment" not in done.stderr.lower(), done.stderr


def test_the_experiments_turned_off_are_known_to_the_installed_grpc() -> None:
    # gRPC logs each name it does not know ("Unknown experiment: ...") and ignores it.
    done = _python("import grpc.aio", {**os.environ, "GRPC_EXPERIMENTS": runtime.GRPC_EXPERIMENTS})
    assert "experiment" not in done.stderr.lower(), done.stderr
    unknown = _python("import grpc.aio", {**os.environ, "GRPC_EXPERIMENTS": "-no_such_thing"})
    assert "Unknown experiment: no_such_thing" in unknown.stderr
