"""Garbage-collector settings for a process that hosts the emulator.

The store and its watch history hold hundreds of thousands of long-lived dicts. With CPython's default
thresholds (700/10/10) every few thousand writes trigger a collection that walks them all, which halves
watch throughput on long runs (measured with bench/apiserver.py: 37k -> 72k events/s for one watcher).
Processes that exist to run the emulator (the CLI, benchmarks) opt in; a library import never does.
"""

from __future__ import annotations

import gc


def tune_for_large_heaps(gen0: int = 50_000, gen1: int = 20, gen2: int = 100) -> None:
    gc.set_threshold(gen0, gen1, gen2)


def freeze_current_heap() -> None:
    """Move everything alive now (e.g. a restored snapshot) out of the collector's view."""
    gc.collect()
    gc.freeze()
