"""The budget controller: GPUWorkloadBudget (gpuops.io/v1alpha1), rolling-window GPU-hour budgets with a
durable ledger and AlertOnly / Pause / Evict enforcement. See reconciler.py for the accounting contract."""

from .setup import BudgetController, install, setup

__all__ = ["BudgetController", "install", "setup"]
