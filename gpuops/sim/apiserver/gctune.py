"""The emulator's processes use the operator's GC settings (gpuops.kube.gctune, where the reasons are)."""

from __future__ import annotations

from gpuops.kube.gctune import freeze_current_heap, tune_for_large_heaps

__all__ = ["freeze_current_heap", "tune_for_large_heaps"]
