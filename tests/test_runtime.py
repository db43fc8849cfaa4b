"""Process tuning: the collector stays on, runs less often, and a tuned block
gives the previous settings back."""

from __future__ import annotations

import gc
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
