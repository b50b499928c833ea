"""What the budget benchmarks share: the namespace and CRDs they run with, the metric they scrape, the target."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CRDS = [ROOT / "manifests" / "crds" / f"{plural}.gpuops.io.yaml" for plural in ("gpuworkloadbudgets", "gpupricelists")]
"""The budget controller's CRDs: budgets and the price lists it reads."""
NS = "bench"
BUDGETS_PATH = f"/apis/gpuops.io/v1alpha1/namespaces/{NS}/gpuworkloadbudgets"
METRIC = "gpuops_budget_consumed_gpu_seconds"  # GPU-seconds; the figures divide it by 3600 (GPU-hours)
TARGET = Fraction(999, 1000)

def ratio(reported: Fraction, truth_value: Fraction) -> float:
    if truth_value == 0:
        return 1.0 if reported == 0 else float("inf")
    return round(float(reported / truth_value), 6)
