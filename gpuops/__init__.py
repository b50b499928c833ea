"""gpuops: a Kubernetes operator suite for GPU clusters."""

__version__ = "0.1.0"
