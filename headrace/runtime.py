"""Process tuning for Headrace servers (node, standalone) and benchmarks.

A WAL node allocates many short-lived objects per message (messages, log
entries, append results) while it keeps a large, long-lived heap (the
write-ahead buffer, gRPC state, imported modules). With CPython's default
collector thresholds the young generation is collected every 700
allocations, and every few of those collections also walk older objects,
which costs a large share of scan and append time. :func:`tune_gc` keeps the
collector on (reference cycles are still reclaimed) but runs it far less often
and moves everything alive at start-up out of its reach.

The WAL writers do their blocking writes and syncs in threads of their own.
Such a thread needs the GIL for a moment before and after each system call;
while the event loop is busy (a node serving many streams), CPython makes a
waiting thread wait up to the *switch interval* (5 ms by default) before the
running thread yields, so every write could stall for several intervals.
:func:`tune_switch_interval` shortens the interval; :func:`tune_process` does
both tunings, as servers and benchmarks call it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import sys
from collections.abc import Iterator

from headrace import errors

GEN0_THRESHOLD = 50_000
"""Allocations (minus deallocations) of tracked objects between young collections."""
GEN1_THRESHOLD = 20
GEN2_THRESHOLD = 20
SWITCH_INTERVAL_S = 0.0005
"""How long a thread waiting for the GIL waits before the running one must yield."""


@dataclasses.dataclass(frozen=True, slots=True)
class GCSettings:
    """What :func:`tune_gc` did, for status and benchmark output."""

    thresholds: tuple[int, int, int]
    frozen_objects: int
    enabled: bool


def tune_gc(
    gen0: int = GEN0_THRESHOLD,
    gen1: int = GEN1_THRESHOLD,
    gen2: int = GEN2_THRESHOLD,
    *,
    freeze: bool = True,
) -> GCSettings:
    """Raise the collector's thresholds and freeze the start-up heap.

    Call it once, after start-up (imports, configuration) and before serving.
    ``freeze`` runs one full collection first, so no garbage is frozen, then
    moves every surviving object to the permanent generation, which later
    collections skip. The collector stays enabled. Calling it again is
    harmless (it freezes what has accumulated since).
    """
    if min(gen0, gen1, gen2) < 1:
        raise errors.InvalidArgument(f"GC thresholds must be positive, got {(gen0, gen1, gen2)}")
    gc.enable()
    if freeze:
        gc.collect()
        gc.freeze()
    gc.set_threshold(gen0, gen1, gen2)
    return current_settings()


def current_settings() -> GCSettings:
    """The collector's current thresholds, frozen object count and state."""
    t0, t1, t2 = gc.get_threshold()
    return GCSettings((t0, t1, t2), gc.get_freeze_count(), gc.isenabled())


def gc_tuned() -> bool:
    """Whether the young-generation threshold is at least :data:`GEN0_THRESHOLD`."""
    return gc.isenabled() and gc.get_threshold()[0] >= GEN0_THRESHOLD


@contextlib.contextmanager
def gc_tuning(
    gen0: int = GEN0_THRESHOLD,
    gen1: int = GEN1_THRESHOLD,
    gen2: int = GEN2_THRESHOLD,
) -> Iterator[GCSettings]:
    """:func:`tune_gc` for a block (a benchmark inside another program);
    the collector's previous thresholds, state and frozen set come back after."""
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    was_frozen = gc.get_freeze_count() > 0
    settings = tune_gc(gen0, gen1, gen2, freeze=not was_frozen)
    try:
        yield settings
    finally:
        gc.set_threshold(*thresholds)
        if not was_frozen:
            gc.unfreeze()
        if not enabled:
            gc.disable()


def tune_switch_interval(seconds: float = SWITCH_INTERVAL_S) -> float:
    """Set the interpreter's thread switch interval; the previous one."""
    if not 0 < seconds <= 1:
        raise errors.InvalidArgument(f"switch interval must be in (0, 1] seconds, got {seconds!r}")
    previous = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    return previous


def tune_process() -> GCSettings:
    """The tuning servers run with: :func:`tune_gc` and :func:`tune_switch_interval`."""
    tune_switch_interval()
    return tune_gc()


@contextlib.contextmanager
def process_tuning() -> Iterator[GCSettings]:
    """:func:`tune_process` for a block; the previous settings come back after."""
    previous = tune_switch_interval()
    try:
        with gc_tuning() as settings:
            yield settings
    finally:
        sys.setswitchinterval(previous)
