"""The budget controller: GPUWorkloadBudget (gpuops.io/v1alpha1), rolling-window GPU-hour budgets with a
durable ledger and AlertOnly / Pause / Evict enforcement. The accounting contract: podcontract.py (what a pod
uses) and ledger.py (how it is kept)."""
