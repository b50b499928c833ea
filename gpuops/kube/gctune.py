"""Garbage-collector settings for processes that hold large caches: the operator and the emulator.

An informer cache of 100,000 pods, like the emulator's store and watch history, is hundreds of thousands of
long-lived dicts and lists. With CPython's default thresholds (700/10/10) every few thousand allocations trigger
a collection that walks them: bench/scale.py at 10 % size measured 8.5 s of collections in 70 s of the
operator's life (5,190 young, 43 full), and the emulator's watch throughput halves on long runs. Raised
thresholds leave it at 0.1 s. Objects decoded from the API are trees, so little cyclic garbage waits longer.
Processes opt in (`gpuops run`, the emulator's CLI, benchmarks); a library import never does.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_current_heap", "tune_for_large_heaps"]


def tune_for_large_heaps(gen0: int = 50_000, gen1: int = 20, gen2: int = 100) -> None:
    gc.set_threshold(gen0, gen1, gen2)


def freeze_current_heap() -> None:
    """Move everything alive now (e.g. a restored snapshot) out of the collector's view."""
    gc.collect()
    gc.freeze()
