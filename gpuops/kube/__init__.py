"""The reconciler framework: informers, work queues, controllers and a manager, knowing Kubernetes but not GPUs.

This package imports nothing of gpuops but itself.
"""
