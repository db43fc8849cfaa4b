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
:func:`tune_switch_interval` shortens the interval.

Batches of record batches are large buffers (a Produce request, its
serialised form, an encoded batch: hundreds of KiB each, made and dropped per
request). glibc's malloc gives such blocks to the kernel on free (``mmap``
above its threshold, or a trim of the heap's top), so the next one of the
same size is page-faulted in again, zeroed page by page: that cost more than
the copies themselves (1.8 µs per 1 KiB message to build and serialise a
request of two 256-message batches, 0.08 µs without the faults).
:func:`tune_malloc` raises both thresholds so the freed memory is reused.
:func:`tune_process` does all three tunings, as servers and benchmarks call it.

gRPC's own threads cost every message a fixed share of CPU. grpcio 1.85 runs
its TCP endpoints (client and listener) on its EventEngine, whose poller
threads read the socket and hand each completion to the completion queue's
thread, which hands it on to the asyncio loop: a thread hop more per read and
write than the older iomgr endpoints, polled by the completion queue's own
thread. A stream of ~100 KiB messages at 1,000 a second cost 270-330 µs of
CPU per message on the sending side and 245-315 µs on the receiving side, and
225-290 / 205-240 µs without those two experiments; the node and the producer
of a 95-message request 710-740 / 680-790 µs, and 555-610 / 565-685 µs
without. gRPC reads ``GRPC_EXPERIMENTS`` once, when it is imported, so
:func:`tune_grpc` runs at the start of the ``headrace`` command, before
anything imports grpc, and its child processes (a benchmark's node and tail
probe) inherit it.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import os
import sys
from collections.abc import Iterator, Mapping, MutableMapping

from headrace import errors

GEN0_THRESHOLD = 50_000
"""Allocations (minus deallocations) of tracked objects between young collections."""
GEN1_THRESHOLD = 20
GEN2_THRESHOLD = 20
SWITCH_INTERVAL_S = 0.0005
"""How long a thread waiting for the GIL waits before the running one must yield."""
MALLOC_MMAP_THRESHOLD = 8 << 20
"""Blocks below this come from malloc's heap (reused after free), not a fresh ``mmap``."""
MALLOC_TRIM_THRESHOLD = 16 << 20
"""Free memory at the heap's top that malloc keeps rather than gives back."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter numbers (``<malloc.h>``)."""
_MALLOC_ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"
"""The gRPC experiments :func:`tune_grpc` turns off (names of the pinned grpcio)."""
_GRPC_CORE = "grpc._cython.cygrpc"
"""The module whose import reads gRPC's configuration."""


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


def malloc_tuning(environ: Mapping[str, str], platform: str) -> tuple[tuple[int, int], ...]:
    """The ``mallopt`` calls :func:`tune_malloc` makes, as (parameter, value)
    pairs: none off Linux, and none when the environment already sets malloc's
    thresholds (``MALLOC_*_THRESHOLD_`` or a ``glibc.malloc`` tunable: the
    operator's choice stands)."""
    if not platform.startswith("linux"):
        return ()
    if any(name in environ for name in _MALLOC_ENVIRONMENT):
        return ()
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return ()
    return ((_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD))


def tune_malloc(environ: Mapping[str, str] = os.environ) -> bool:
    """Make :func:`malloc_tuning`'s ``mallopt`` calls; whether all were made
    and accepted (False without glibc's ``mallopt``, e.g. on musl, where it
    accepts nothing)."""
    settings = malloc_tuning(environ, sys.platform)
    if not settings:
        return False
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallopt"):
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return all([mallopt(parameter, value) == 1 for parameter, value in settings])


def grpc_tuning(environ: Mapping[str, str], grpc_loaded: bool) -> dict[str, str]:
    """The environment variables :func:`tune_grpc` sets (pure): none when
    gRPC is already loaded (it read its configuration then, and this
    process's children would not run like it) or when the environment
    already names gRPC's experiments (the operator's choice stands, even
    empty)."""
    if grpc_loaded or "GRPC_EXPERIMENTS" in environ:
        return {}
    return {"GRPC_EXPERIMENTS": GRPC_EXPERIMENTS}


def tune_grpc(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set :func:`grpc_tuning`'s variables in ``environ``; whether it set any.
    Call it before anything imports grpc."""
    settings = grpc_tuning(environ, _GRPC_CORE in sys.modules)
    environ.update(settings)
    return bool(settings)


def tune_process() -> GCSettings:
    """The tuning servers run with: :func:`tune_malloc`, :func:`tune_gc` and
    :func:`tune_switch_interval`."""
    tune_malloc()
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
