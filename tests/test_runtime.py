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
