"""The node autoprovision controller: GPUNodeGroup (gpuops.io/v1alpha1), GPU machines powered on for pending
GPU pods and off when idle, through HTTP webhooks (`power.py`), decided by `gpuops.accounting.capacity`."""
